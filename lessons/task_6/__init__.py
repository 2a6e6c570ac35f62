"""Task 6, many users at once: levels of 1, 5, 10 and 20 concurrent streamed requests to the
lab's vLLM server, each level in passes that take turns, and one request alone checked two ways
before the scaling factor is printed. Read in order:

    task_6_multi_user_load.py   the measurement, the report and its insight
    record.py                   what it saves: the levels, their spreads, one request alone
    figure.py                   throughput, latency, one after another against all at once
"""
