"""Task 9, the engine built from scratch: mini_engine checked against transformers, static
against continuous batching, where a decode step's time goes, then vLLM on the same workload.
Read in this order:

    task_9_build_your_own_engine.py   parts 1, 2 and 4 set up and measured
    profile.py                        part 3: the step's phases, the kernel floor, the kernels
    record.py                         OwnEngine, the record it saves, and the summary's row
    report.py                         the printing and the insight lines
    figure.py                         the batching timeline and the step's phases
"""

OWN_PARTS = ("profile",)   # besides the roles (tests/test_layout.py)
