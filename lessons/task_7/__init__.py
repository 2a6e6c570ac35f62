"""Task 7, tuning the server: the same load on three configs (max_model_len, max_num_seqs), the
server restarted for each, each config's load in passes. Read in order:

    task_7_tuning.py    the measurement, the report and its insight
    record.py           what it saves: each config's run, the spread of its passes; the summary row
    figure.py           throughput with its spread, latency, requests running and waiting
"""
