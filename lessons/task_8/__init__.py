"""Task 8, a live dashboard over vLLM's /metrics: tokens/s, running and waiting requests, the
KV cache and latency as the server works, and with --once one boxed snapshot. Read in order:

    task_8_dashboard.py   the snapshot's measurement (--once, --load N), the page started
    monitor.py            the Monitor that polls /metrics and sends a load, the page over it
    record.py             Dashboard, the record --once saves, and the summary's row
    report.py             the printing: the header, the interval, the load, the KEY INSIGHT,
                          where the page is
"""
from lessons.task_8.record import Dashboard, summary_row

OWN_PARTS = ("monitor",)   # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py)
RECORD = Dashboard    # results/task_8_dashboard.json
FIGURES = ()          # none: the live page is its picture
