"""Task 14's record by hand (tests/hand/__init__.py): the defaults' run in bf16, SmolLM2-135M's
shape (30 layers, 3 KV heads of 64), pages of 32, 128 MiB for part 1 and 16 MiB for part 3. Its
tests: tests/tasks/test_task_14.py."""
from __future__ import annotations

from common import results
from lessons.task_14.record import Capacity, Quality, QuantizedKV, Settings, Throughput

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="bfloat16", threads=2)
MIB = 1 << 20
# the summary's row: fp8 token 353 pages / bf16 182 = 1.94x; part 3 mini_engine 300 / 150 tok/s
# = 2.00x; 4 of 8 answers the same
SUMMARY_ROW = "1.94x tokens, 2.00x tok/s, 4/8 answers same"


def record(header: results.RunHeader | None = None) -> QuantizedKV:
    """Part 1, 128 MiB = 134,217,728 B in pages of 32 tokens: bf16 23,040 B a token (2 x 30 x 3 x
    64 x 2) -> 182 pages (5,824 tokens, 45 users of 128); fp32 46,080 -> 91 (2,912, 22); fp8 with
    a scale a layer 11,520 -> 364 (11,648, 91); with a scale a token and head 11,520 + 2 x 30 x 3
    x 2 = 11,880 -> 353 (11,296, 88). In 16 MiB = 16,777,216 B: 22, 11, 45 and 44 pages."""
    s = Settings(32, 134_217_728, 128, 8, 50, 256, 257, 16 * MIB, 16, 200, 48, 8000, True,
                 "one pass of C each (mini_engine/kernels/kv_quant.c)", "c")
    capacity = [Capacity("bfloat16", 23_040, 182, 22, 182, 22),
                Capacity("float32", 46_080, 91, 11),
                Capacity("fp8 layer", 11_520, 364, 45, 364, 45),
                Capacity("fp8 token", 11_880, 353, 44, 353)]
    diffs_layer = [0, 8, 1, 6, 0, 12, None, 9]               # 1 of 8 identical
    diffs_token = [None, None, 17, 6, 0, 1, None, None]      # 4 of 8
    quality = [Quality("mini_engine", "fp8 layer", 1, diffs_layer, 1, 0, 0.250, 24.10),
               Quality("mini_engine", "fp8 token", 4, diffs_token, 0, 0, 0.060, 19.20),
               Quality("mini_engine", "fp8_e5m2 layer", 2, [None, None, 1, 2, 5, 12, 15, 9],
                       0, 1, 0.180, 22.00),
               Quality("mini_engine", "fp8_e5m2 token", 1, [None, 3, 4, 6, 5, 1, 14, 25],
                       0, 0, 0.170, 21.80),
               Quality("vLLM", "fp8 layer", 1, [0, 5, 2, 22, None, 3, 7, 1], 3, 0, 0.270,
                       24.50),
               Quality("vLLM", "fp8_e5m2 layer", 1, [0, 4, 2, 9, None, 3, 1, 2], 4, 0, 0.190,
                       22.30)]
    # part 3, 16 prompts of 200 tokens, 48 tokens each (768): mini_engine bf16 150 tok/s (5.12 s,
    # 2 at once), fp8 token 300 (2.56 s, 4): 2.00x; vLLM bf16 200 (3.84 s), fp8 160 (4.8 s): 0.80x
    throughput = [Throughput("mini_engine", "bfloat16", 704, 2, 12, 768, 5.12, 0.030),
                  Throughput("mini_engine", "fp8 token", 1408, 4, 3, 768, 2.56, 0.025),
                  Throughput("vLLM", "bfloat16", 704, 2, 9, 768, 3.84, 0.024),
                  Throughput("vLLM", "fp8 layer", 1440, 4, 2, 768, 4.80, 0.040)]
    return QuantizedKV(s, capacity, {"mini_engine": 18.90, "vLLM": 18.95},
                       {"mini_engine": 1, "vLLM": 1}, quality, throughput,
                       header=header or HEADER)
