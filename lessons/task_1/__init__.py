"""Task 1, the baseline: one request through transformers' generate(), timed. Read in order:

    task_1_hf_baseline.py   loads the model, generates, calls the report, saves
    report.py               the report's figures and the insight lines
    record.py               HFBaseline, the record it saves, and the summary's row
"""
from lessons.task_1.record import HFBaseline, summary_row

# what the lab reads back (common/steps.py)
RECORD = HFBaseline     # results/task_1_hf_baseline.json
FIGURES = ()            # none: one request's figures are numbers
