"""Step 0, the environment check: the five checks of the source, the machine and the dtype
`--dtype auto` picks there. Read in order:

    verify_environment.py   the checks, each PASS or FAIL with its fix
    record.py               EnvironmentCheck, the record it saves, and the summary's row
"""
from lessons.verify_environment.record import EnvironmentCheck, summary_row

# what the lab reads back (common/steps.py)
RECORD = EnvironmentCheck   # results/verify_environment.json
FIGURES = ()                # none: five checks are a list
