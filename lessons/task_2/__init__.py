"""Task 2, vLLM offline: the same request as task 1 through vllm.LLM, compared with it, and the
KV capacity the engine allocated checked against the model config. Read in order:

    task_2_vllm_inference.py   starts the engine, generates, calls the report, saves
    report.py                  the comparison, the KV capacity check, the insight lines
    record.py                  VLLMInference, the record it saves, and the summary's row
"""
from lessons.task_2.record import VLLMInference, summary_row

# what the lab reads back (common/steps.py)
RECORD = VLLMInference   # results/task_2_vllm_inference.json
FIGURES = ()             # none: the comparison and the capacity are a table each
