"""The summary: the source's closing table (its section 10) from every step's saved result, the
roofline of this machine with the lab's steps placed under it, and the lab's last run. Read in
order:

    summary.py    reads the saved results, places the steps, calls the printer
    report.py     what it prints: the table, the twins, the roofline, the KEY INSIGHT
    roofline.py   the roofline: its ceilings, the three rungs of a step, the steps placed
    record.py     Summary, the record it saves
    figure.py     the roofline with the kernel floor, the measured steps and task 9's engine
"""
from lessons.summary.figure import draw_roofline
from lessons.summary.record import Summary

OWN_PARTS = ("roofline",)   # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py; the summary has no row in its own table)
RECORD = Summary                    # results/summary.json
FIGURES = (("", draw_roofline),)    # results/summary.png
