"""Task 5, the OpenAI-compatible server: the lab's vLLM server started (or reused), one
completion sent as raw HTTP and through the openai client, taking turns. Read in order:

    task_5_api_server.py   starts or finds the server, sends the requests, calls the report
    report.py              the server, each client's response, the insight lines
    record.py              ApiServer, the record it saves, and the summary's row
"""
from lessons.task_5.record import ApiServer, summary_row

# what the lab reads back (common/steps.py)
RECORD = ApiServer    # results/task_5_api_server.json
FIGURES = ()          # none: two requests' figures are numbers
