"""Task 6, many users at once: levels of 1, 5, 10 and 20 concurrent streamed requests to the
lab's vLLM server, each level in passes that take turns, and one request alone checked two ways
before the scaling factor is printed. Read in order:

    task_6_multi_user_load.py   the measurement: the levels in turns, then one after another
    record.py                   what it saves: the levels, their spreads, one request alone
                                (twins), the wait in line; the summary's row
    report.py                   what it prints: the levels, the scaling, the KEY INSIGHT
    figure.py                   throughput, latency, one after another against all at once
"""
from lessons.task_6.figure import draw_load_levels
from lessons.task_6.record import MultiUserLoad, summary_row

# what the lab reads back (common/steps.py)
RECORD = MultiUserLoad                 # results/task_6_multi_user_load.json
FIGURES = (("", draw_load_levels),)    # results/task_6_multi_user_load.png

