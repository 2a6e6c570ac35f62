"""Task 11's record by hand (tests/hand/__init__.py): the defaults' run, 4 chats and 2 long
documents, without chunking and at budgets 512, 256, 128 and 64. Its tests:
tests/tasks/test_task_11.py."""
from __future__ import annotations

from common import results
from common.load import LoadLevel
from common.measure import Spread
from lessons.task_11.record import (ChunkedPrefill, Correctness, EngineRun, IterationTokens,
                                    Latency, Passes, ServerRun, Settings, Timeline, WorkloadShape)

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="bfloat16", threads=2)
BUDGETS = [512, 256, 128, 64]
# the summary's row of record(): the chats' longest stall 1,165 -> 157 ms at budget 64 (-87%),
# the documents' TTFT 1.21 -> 1.70 s (+40%), vLLM's stall 700 -> 63 ms (-91%) and its TTFT
# 0.95 -> 1.40 s (+47%)
SUMMARY_ROW = "stall -87%, TTFT +40% (vLLM stall -91%, TTFT +47%)"
# the hand-made run: no chunking, then each budget; the chats' longest stall (ms) and the long
# documents' TTFT (s, each of 2); the issue's figures for no chunking and the smallest budget
STALL_MS = {None: 1165, 512: 480, 256: 330, 128: 210, 64: 157}
TTFT_S = {None: (1.0, 1.42), 512: (1.05, 1.5), 256: (1.1, 1.6), 128: (1.2, 1.8), 64: (1.4, 2.0)}
VLLM_STALL_MS = {None: 700, 512: 260, 256: 160, 128: 95, 64: 63}
# no chunking and budget 64 ran 3 passes each (the others once): the lowest and highest pass of
# the stall (ms) and the mean TTFT (s), the median the run's own; every spread apart from the other
# setting's
PASSES = {"mini_engine": {None: ((1100, 1250), (1.15, 1.30)), 64: ((150, 170), (1.60, 1.80))},
          "vLLM": {None: ((650, 760), (0.90, 1.05)), 64: ((60, 70), (1.30, 1.50))}}


def hand_passes(latency: Latency, stall_ms: tuple[float, float], ttft_s: tuple[float, float]
                ) -> Passes:
    return Passes(Spread(latency.max_itl_s, stall_ms[0] / 1000, stall_ms[1] / 1000, 3),
                  Spread(latency.mean_long_ttft_s, *ttft_s, 3))


def hand_latency(stall_ms: float, ttft_s: tuple[float, ...]) -> Latency:
    return Latency(mean_itl_s=0.05, p99_itl_s=stall_ms / 1000 * 0.9, max_itl_s=stall_ms / 1000,
                   long_ttft_s=list(ttft_s))


def hand_timeline(budget: int | None) -> Timeline:
    """The chats' 160 prompt tokens in chunks of the budget; then 4 chats decoding (4 tokens a
    step) and 2 prompts of 1,234 tokens: whole in a step each without chunking, else budget - 4
    a step (the last chunk what is left); then 5 steps of decodes."""
    step = budget or 2048
    chats = [min(step, 160 - i) for i in range(0, 160, step)]
    longs = [1234, 1234] if budget is None else \
        [min(budget - 4, 2468 - i) for i in range(0, 2468, budget - 4)]
    decode = [0] * len(chats) + [4] * (len(longs) + 5)
    prefill = chats + longs + [0] * 5
    return Timeline(decode, prefill, [0.05 * (i + 1) for i in range(len(decode))],
                    [[0.05 * (i + 1) for i in range(len(decode))] for _ in range(4)], 0.05,
                    [0.5, 1.0])


def hand_engine(budget: int | None) -> EngineRun:
    timeline = hand_timeline(budget)
    num_tokens = [d + p for d, p in zip(timeline.decode_tokens, timeline.prefill_tokens)]
    latency = hand_latency(STALL_MS[budget], TTFT_S[budget])
    passes = PASSES["mini_engine"].get(budget)
    return EngineRun("no chunking" if budget is None else f"budget {budget}", budget or 2048,
                     budget is not None, latency, 3.0, 96.0, len(num_tokens), max(num_tokens),
                     timeline, hand_passes(latency, *passes) if passes else None)


def hand_server(budget: int | None) -> ServerRun:
    level = LoadLevel(6, 6, 3.2, 288, 90.0, mean_latency_s=2.0, p50_latency_s=2.1,
                      p95_latency_s=3.0, mean_ttft_s=0.6, p95_ttft_s=1.3, mean_tpot_s=0.04)
    # the prompts counted whole in the step that ends them: the 2 documents; at 64 also a step
    # that ends two chats' prompts (80 tokens)
    over = 2 + (budget == 64)
    histogram = IterationTokens(65, 2828, {8: 63, 2048: 2} if budget is None else
                                {8: 65 - over, 64: 0, 2048: over})
    latency = hand_latency(VLLM_STALL_MS[budget], (0.9, 1.0) if budget is None else (1.2, 1.6))
    passes = PASSES["vLLM"].get(budget)
    return ServerRun("no chunking" if budget is None else f"budget {budget}", budget or 2048,
                     budget is not None, level, latency, histogram,
                     2 if budget is None else 2468 // (budget - 4) + 1, 8, 12.0,
                     hand_passes(latency, *passes) if passes else None)


def record(header: results.RunHeader | None = None) -> ChunkedPrefill:
    """The defaults' run: 4 chats of 64 tokens, 2 documents of 1,200 tokens of the GPL-3 (1,234
    prompt tokens each) making 16. Its summary row: the stall 1,165 -> 157 ms is -87%, the TTFT
    1.21 -> 1.70 s is +40%, vLLM's stall 700 -> 63 ms -91%, its TTFT 0.95 -> 1.40 s +47%."""
    return ChunkedPrefill(
        Settings(num_chats=4, chat_output_tokens=64, num_long_docs=2, long_tokens=1200,
                 long_output_tokens=16, arrive_after_tokens=8, budgets_tokens=BUDGETS,
                 page_size_tokens=16, max_num_seqs=16, max_model_len=2048,
                 kv_cache_bytes=137363456, port=8000, is_vllm_measured=True, num_passes=3),
        WorkloadShape(source="/usr/share/common-licenses/GPL-3", num_source_tokens=6935,
                      min_chat_prompt_tokens=39, max_chat_prompt_tokens=42,
                      min_long_prompt_tokens=1234, max_long_prompt_tokens=1234,
                      num_long_prompt_tokens=2468),
        Correctness(num_requests=6, num_identical=[6, 6, 6, 6], num_checked_hf=2,
                    num_identical_hf=2),
        [6, 5, 6, 4],
        [hand_engine(b) for b in [None, *BUDGETS]],
        [hand_server(b) for b in [None, *BUDGETS]],
        header=header or HEADER)
