"""Task 9's record by hand (tests/hand/__init__.py): the hand workload of
tests/engine/test_engine.py, 4 requests at a batch cap of 2, every field filled. Its tests:
tests/tasks/test_task_9.py."""
from __future__ import annotations

from common import results, settings
from lessons.task_9.record import (Correctness, HFRun, MachineBounds, OwnEngine, Phases,
                                   PolicyRun, RunSettings, StepTimeline, VllmRun, VllmSettings,
                                   ratios)

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32", threads=2)
# the summary's row of record(): 8 of 8 prompts identical to transformers; continuous over
# static, round by round (record() works them out), 1.654x, from 1.579 to 1.667; over vLLM
# 1.306x, from 1.250 to 1.364
SUMMARY_ROW = "8/8 = HF, 1.65x static (1.58-1.67), 1.31x vLLM (1.25-1.36)"

# --- the hand workload: tests/engine/test_engine.py's ---------------------------------------
# outputs of 8, 1, 1, 1 tokens in arrival order, batch cap 2, one token per live request per
# step. By hand:
# - static: [0, 1] for 8 steps (1 is done after step 0 and stays as padding for steps 1-7), then
#   [2, 3] at step 8: 9 steps;
# - static no-pad: the same, but 1's row leaves the compute after step 0 and no one takes its
#   slot before the batch ends: slot 1 idle for steps 1-7;
# - continuous: 2 takes 1's slot at step 1, 3 takes 2's at step 2, then 0 runs alone: 8 steps.
HAND = {"static": StepTimeline(["0 1"] * 8 + ["2 3"], [""] + ["1"] * 7 + [""]),
        "static no-pad": StepTimeline(["0 1"] + ["0"] * 7 + ["2 3"], [""] * 9),
        "continuous": StepTimeline(["0 1", "0 2", "0 3"] + ["0"] * 5, [""] * 8)}


def hand_policy(label: str, pass_tokens_per_s: list[float], num_steps: int,
                peak_num_pages: int) -> PolicyRun:
    """The hand workload's 11 tokens, its median pass (the first given); slot utilisation = 11 /
    (2 slots x steps)."""
    tokens_per_s = pass_tokens_per_s[0]
    return PolicyRun(label, tokens_per_s, 11 / tokens_per_s, 11, 0.1, 0.2, 0.05, num_steps,
                     11 / (2 * num_steps), peak_num_pages, 16, 0, pass_tokens_per_s)


def hand_phases(matmul_s: float, num_steps: int) -> Phases:
    return Phases(matmul_s, 0.002, 0.003, 0.001, 0.0006, matmul_s + 0.0066, num_steps)


# what the engine ran (LLMEngine.kernels_used) with --kernels c on an AMX Xeon: every part in C
# where it builds, no 8-bit cache (the model's dtype), the forward eager
KERNELS = {"attention": "C, blocks in place", "products": "oneDNN packed", "8-bit cache": "-",
           "forward": "eager"}


def record(header: results.RunHeader | None = None, with_vllm: bool = True) -> OwnEngine:
    """Task 9 on the hand workload (cap 2), every field filled (header: the run's, else HEADER).
    Three rounds in turns, tok/s by round, the first each way's median: static 40.0, 38.0, 42.0;
    static no-pad 44.0, 41.8, 46.2 (1.10x static in every round); continuous 66.16, 60.0, 70.0
    (over static 1.654, 1.579, 1.667; over no-pad 1.504, 1.435, 1.515); vLLM 50.66, 44.0, 56.0
    (continuous over it 1.306, 1.364, 1.250). Median rounds: 1.654x static, of which 1.10x from
    the padding and 1.504x from the refill; 1.306x vLLM. The decode step at batch 2: matmuls 80
    ms in the engine (oneDNN packed: KERNELS), the kernel floor through F.linear 72 ms. The pool:
    128 MiB of float32 KV, 46,080 B a token, in blocks of 16 = 182 blocks. with_vllm=False:
    without part 4."""
    policies = {"static": hand_policy("static", [40.0, 38.0, 42.0], 9, 2),
                "static no-pad": hand_policy("static no-pad", [44.0, 41.8, 46.2], 9, 2),
                "continuous": hand_policy("continuous", [66.16, 60.0, 70.0], 8, 2)}
    vllm = (VllmRun(11 / 50.66, 11, 50.66, 2,
                    VllmSettings(128, settings.KV_CACHE_BYTES, 16, True, "float32", 2), 16, 364,
                    [50.66, 44.0, 56.0])
            if with_vllm else None)
    cont_over_static, engine_over_vllm = ratios(policies, vllm)
    return OwnEngine(
        header=header or HEADER,
        settings=RunSettings(4, 8, 0, 2, 16, settings.KV_CACHE_BYTES, 128, "both",
                             settings.TEMPERATURE),
        correctness=Correctness(8, [1, 5, 11, 12, 9, 10, 19, 29], 16, 8, [], 16),
        workload_num_output_tokens=[8, 1, 1, 1], policies=policies, timelines=dict(HAND),
        phases={1: hand_phases(0.070, 23), 2: hand_phases(0.080, 5)},
        machine=MachineBounds(20e9, 538_000_000, 0.0269, "measured now",
                              {1: 0.065, 2: 0.072}),
        kernels=dict(KERNELS),
        vllm=vllm, transformers_static=HFRun(0.5, 11, 22.0) if with_vllm else None,
        continuous_over_static_spread=cont_over_static, engine_over_vllm_spread=engine_over_vllm,
        num_kv_blocks=182)
