"""Task 8, a live dashboard over vLLM's /metrics: tokens/s, running and waiting requests, the
KV cache and latency as the server works, and with --once one boxed snapshot. Read in order:

    task_8_dashboard.py   the snapshot's record and its measurement (--once, --load N)
    monitor.py            the Monitor that polls /metrics and sends a load, the page over it
    report.py             the printing: the header, the interval, the load, where the page is
"""

OWN_PARTS = ("monitor",)   # besides the roles (tests/test_layout.py)
