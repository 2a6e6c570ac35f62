"""Task 13's record by hand (tests/hand/__init__.py): the defaults' run, task 9's workload of 48
requests (550 tokens), cap 16, mini_engine three ways (torch, eager with its C kernels,
compiled), and vLLM with 16 requests of 64 tokens, eager and compiled. Its tests:
tests/tasks/test_task_13.py."""
from __future__ import annotations

from common import results
from lessons.task_13.record import AttentionSweep, CompiledStep, EngineMode, Settings, VllmMode
from lessons.task_9.record import MachineBounds, Phases

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="bfloat16", threads=2)
MS = 1e-3
# the summary's row of record(): mini_engine 308 / 280 = 1.10x; vLLM 585 / 450 = 1.30x, PSS
# 1.55 - 1.40 = +0.15 GB
SUMMARY_ROW = "mini_engine 1.10x, vLLM 1.30x (+0.15 GB)"
# what each way ran (LLMEngine.kernels_used): the torch way; eager, every part in C (matmul.c
# the packed product kept: PRODUCTS_MS); compiled, the same C in the graph
TORCH_KERNELS = {"attention": "torch, gathered + SDPA", "products": "F.linear",
                 "8-bit cache": "-", "forward": "eager"}
C_KERNELS = {"attention": "C, blocks in place", "products": "matmul.c", "8-bit cache": "-",
             "forward": "eager"}
# ms of a pass over every product of the model at batch 1 and 16, timed when the engine chose:
# summed, F.linear 47.0, matmul.c 36.0, oneDNN packed 36.5: matmul.c kept
PRODUCTS_MS = {"F.linear": [20.0, 27.0], "matmul.c": [15.0, 21.0], "oneDNN packed": [16.5, 20.0]}


def phases(matmul: float, attention: float, rest: float, sampling: float, scheduling: float,
           num_steps: int) -> Phases:
    """A decode step's phases in ms; the step is their sum."""
    parts = [matmul, attention, rest, sampling, scheduling]
    return Phases(*(p * MS for p in parts), step_s=sum(parts) * MS, num_steps=num_steps)


def record(header: results.RunHeader | None = None) -> CompiledStep:
    """The torch way: a step of 26.0 ms at 1 (18 + 3 + 4.5 + 0.3 + 0.2) and 52.5 at 16 (30 + 14
    + 6.5 + 1.5 + 0.5), 200 tok/s. Eager, its C kernels: 23.0 ms at 1 (16 + 2 + 4.5 + 0.3 + 0.2)
    and 37.0 at 16 (22 + 6.5 + 6.5 + 1.5 + 0.5), 280 tok/s: 1.40x the torch way's. Compiled,
    the same products and attention, the rest at 16 down to 3.0 ms: 33.5 ms. The weights, 270 MB
    at 12.5 GB/s: 21.6 ms a read."""
    torch_way = EngineMode(1.2, 300 << 20, 0, {1: phases(18, 3, 4.5, 0.3, 0.2, 23),
                                               16: phases(30, 14, 6.5, 1.5, 0.5, 9)},
                           200.0, 550, 550 / 200.0, dict(TORCH_KERNELS))
    eager = EngineMode(1.5, 316 << 20, 0, {1: phases(16, 2, 4.5, 0.3, 0.2, 23),
                                           16: phases(22, 6.5, 6.5, 1.5, 0.5, 9)},
                       280.0, 550, 550 / 280.0, dict(C_KERNELS), dict(PRODUCTS_MS))
    compiled = EngineMode(41.0, 442 << 20, 1, {1: phases(16, 2, 4.0, 0.3, 0.2, 23),
                                               16: phases(22, 6.5, 3.0, 1.5, 0.5, 9)},
                          308.0, 550, 550 / 308.0, C_KERNELS | {"forward": "compiled"},
                          dict(PRODUCTS_MS))
    answers = [f"answer {i}" for i in range(16)]
    # task 9's workload through vLLM, in turns with mini_engine run the same way: eager 250 tok/s
    # against mini_engine's 278 in those rounds (280 of all its passes): 1.11x; compiled 280
    # against 308: 1.10x
    vllm = {"eager": VllmMode(True, 8.5, 1_400_000_000, 42.0, 450.0, answers, 250.0, 278.0),
            "compiled": VllmMode(False, 72.5, 1_550_000_000, 56.0, 585.0,
                                 answers[:15] + ["another answer"], 280.0, 308.0)}
    # part 4, ms of a decode step's attention at contexts of 128 to 1,024: at 16 and 1,024
    # mini_engine's C 124.2 (6.7x its 18.5 at 128), its torch way 183.8, vLLM 41.4 (8.0x its
    # 5.2); mini_engine over vLLM 3.0x at 1,024, 3.6x at 128: a gap that did not grow
    sweep = AttentionSweep([128, 256, 512, 1024],
                           {1: [3.1, 4.6, 7.0, 12.1], 16: [15.9, 25.4, 73.9, 183.8]},
                           {1: [2.5, 3.9, 5.7, 9.8], 16: [18.5, 28.0, 64.8, 124.2]},
                           {1: [0.4, 0.8, 1.4, 2.7], 16: [5.2, 11.3, 19.7, 41.4]})
    return CompiledStep(Settings(48, 10, 16, 134_217_728, 16, 16, 64),
                        MachineBounds(12.5e9, 270_000_000, 0.0216, "measured now",
                                      {1: 0.018, 16: 0.025}),
                        eager, compiled, None, 38, 48, vllm, attention=sweep,
                        header=header or HEADER, torch=torch_way)
