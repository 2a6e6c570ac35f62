"""Task 3, the KV cache problem: contiguous allocation reserves the longest request's slots for
every request; the source's five requests show how much of it holds nothing. Read in order:

    task_3_kv_cache_problem.py   the simulation; calls the report, saves
    report.py                    the report and its insight lines
    record.py                    ContiguousKV, the record it saves, and the summary's row
    figure.py                    each request's slots used against those reserved
"""
from lessons.task_3.figure import draw_reservations
from lessons.task_3.record import ContiguousKV, summary_row

# what the lab reads back (common/steps.py)
RECORD = ContiguousKV                   # results/task_3_kv_cache_problem.json
FIGURES = (("", draw_reservations),)    # results/task_3_kv_cache_problem.png
