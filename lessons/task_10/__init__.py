"""Task 10, prefix caching: requests that start with the same tokens share those blocks and skip
computing them, built in mini_engine and measured in vLLM, cache off then on. Read in order:

    task_10_prefix_caching.py   sets up and measures, then prints
    workloads.py                the shared-system-prompt chats and their shuffled control
    record.py                   PrefixCaching, the record it saves, and the summary's row
    report.py                   the printing and the KEY INSIGHT lines
    figure.py                   the block tables at the peak, the shared blocks marked
"""
from lessons.task_10.figure import draw_shared_pages
from lessons.task_10.record import PrefixCaching, summary_row

# what the lab reads back (common/steps.py)
RECORD = PrefixCaching                  # results/task_10_prefix_caching.json
FIGURES = (("", draw_shared_pages),)    # results/task_10_prefix_caching.png
