"""Task 13, the step itself: what compiling the model buys, in mini_engine and in vLLM (the source
turned compilation off, to save memory). Read in this order:

    task_13_compiled_step.py   sets up and measures, then prints
    vllm_run.py                part 3's fresh process: vLLM eager or compiled, taking turns
    attention.py               part 4: a decode step's attention as the context grows, both engines
    record.py                  CompiledStep, the record it saves, the summary's row
    report.py                  the printing and the KEY INSIGHT lines
    figure.py                  a step's time in its parts, eager and compiled, against the floors
"""
from lessons.task_13.figure import draw_step
from lessons.task_13.record import CompiledStep, summary_row

OWN_PARTS = ("vllm_run", "attention")   # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py)
RECORD = CompiledStep                   # results/task_13_compiled_step.json
FIGURES = (("", draw_step),)            # results/task_13_compiled_step.png
