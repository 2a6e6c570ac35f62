"""The lessons whose code would not fit in their script: one package per task, lessons/task_<N>/,
each module named by its role (record, report, figure, workloads, or the task's own part:
monitor, profile, load); its __init__ lists them in the order a learner reads them, script
first. Tasks 1-3 and 5 are whole in their scripts."""
