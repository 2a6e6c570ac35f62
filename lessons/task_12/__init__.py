"""Task 12, speculative decoding: guess the next k tokens from the request's own text (n-gram
prompt lookup), check them in one forward, keep those the model agrees with. Built in
mini_engine and measured in vLLM, on a copy workload and a chat one. Read in this order:

    task_12_speculative_decoding.py   sets up and measures, then prints
    workloads.py                      the copy and chat workloads
    record.py                         SpeculativeDecoding, the record it saves, the summary's row
    report.py                         the printing and the KEY INSIGHT lines
    figure.py                         an answer's tokens by how they came, and the speed-ups
"""
from lessons.task_12.figure import draw_speculation
from lessons.task_12.record import SpeculativeDecoding, summary_row

# what the lab reads back (common/steps.py)
RECORD = SpeculativeDecoding            # results/task_12_speculative_decoding.json
FIGURES = (("", draw_speculation),)     # results/task_12_speculative_decoding.png
