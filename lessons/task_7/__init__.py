"""Task 7, tuning the server: the same load on three configs (max_model_len, max_num_seqs), the
server restarted for each, each config's load in passes. Read in order:

    task_7_tuning.py    the measurement: a server for each config, the load in passes
    record.py           what it saves: each config's run, the spread of its passes; the summary row
    report.py           what it prints: each config, the three side by side, the KEY INSIGHT
    figure.py           throughput with its spread, latency, requests running and waiting
"""
from lessons.task_7.figure import draw_tuning
from lessons.task_7.record import Tuning, summary_row

# what the lab reads back (common/steps.py)
RECORD = Tuning                   # results/task_7_tuning.json
FIGURES = (("", draw_tuning),)    # results/task_7_tuning.png

