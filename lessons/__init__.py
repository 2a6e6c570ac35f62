"""Each lesson's own code, one package per script: lessons/task_<N>/ for task_<N>_*.py, and
lessons/verify_environment/ and lessons/summary/ for those two. Each module is named by its role
(record, report, figure, workloads, or the lesson's own part: monitor, profile, load, roofline);
its __init__ lists them in the order a learner reads them, script first, and names what the lab
reads back from the lesson (common/steps.py): RECORD, the dataclass its result is saved as;
summary_row, its figure in the summary's table; FIGURES, its pictures."""
