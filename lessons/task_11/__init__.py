"""Task 11, chunked prefill: a long prompt computed whole stalls every streaming request; a
token budget per step cuts it into chunks. Built in mini_engine, measured in vLLM, by budget.
Read in this order:

    task_11_chunked_prefill.py   sets up and measures, then prints
    workloads.py                 the short chats and the long documents that arrive among them
    load.py                      vLLM's staggered load and its tokens-per-step histogram
    record.py                    ChunkedPrefill, the record it saves, and the summary's row
    report.py                    the printing and the KEY INSIGHT lines
    figure.py                    the tokens of each step and the chats' stalls
"""
from lessons.task_11.figure import draw_chunking
from lessons.task_11.record import ChunkedPrefill, summary_row

OWN_PARTS = ("load",)   # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py)
RECORD = ChunkedPrefill                 # results/task_11_chunked_prefill.json
FIGURES = (("", draw_chunking),)        # results/task_11_chunked_prefill.png
