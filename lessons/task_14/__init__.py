"""Task 14, half the bytes a token: a quantized KV cache, built in mini_engine
(mini_engine/kv_quant.py) and measured in vLLM (--kv-cache-dtype). Read in this order:

    task_14_quantized_kv.py    sets up and measures, then prints
    quality.py                 mini_engine's runs, and the comparisons both engines share
    vllm_side.py               vLLM's server at each --kv-cache-dtype: read, asked, loaded
    record.py                  QuantizedKV, the record it saves, the summary's row
    report.py                  the printing and the KEY INSIGHT lines
    figure.py                  capacity bars, and each format's cost beside what it bought
"""
from lessons.task_14.figure import draw_quantized_kv
from lessons.task_14.record import QuantizedKV, summary_row

OWN_PARTS = ("quality", "vllm_side")   # besides the roles (tests/test_layout.py)

# what the lab reads back (common/steps.py)
RECORD = QuantizedKV                    # results/task_14_quantized_kv.json
FIGURES = (("", draw_quantized_kv),)    # results/task_14_quantized_kv.png
