"""A lesson's tests, or a few lessons' together: each task's record, report, figures and insight
lines, and the task end to end on the tiny model (on the real model: the lab's quick run, one
test a file taking lab_run)."""
