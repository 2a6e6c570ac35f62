"""Task 9, the engine built from scratch: mini_engine checked against transformers, static
against continuous batching, where a decode step's time goes, then vLLM on the same workload.
Read in this order:

    task_9_build_your_own_engine.py   parts 1, 2 and 4 set up and measured
    workloads.py                      the mixed-length workload (task 13 runs it too)
    profile.py                        part 3: the step's phases, the kernel floor, the kernels
    record.py                         OwnEngine, the record it saves, and the summary's row
    report.py                         the printing and the insight lines
    figure.py                         the batching timeline and the step's phases
"""
from lessons.task_9.figure import FIGURES   # the batching timeline, the step's phases
from lessons.task_9.record import OwnEngine, summary_row

OWN_PARTS = ("profile",)   # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py)
RECORD = OwnEngine    # results/task_9_build_your_own_engine.json
