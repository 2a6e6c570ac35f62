"""Task 12's record by hand (tests/hand/__init__.py): the defaults' run, k = 2, 4 and 8 on the
copy and the chat workloads, one at a time and 16 at once, and vLLM's ngram at k = 4. Its tests:
tests/tasks/test_task_12.py."""
from __future__ import annotations

from common import results
from common.load import LoadLevel
from lessons.task_12.record import (Answer, Check, EngineRun, ServerRun, Settings,
                                    SpeculativeDecoding, WorkloadShape)

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="bfloat16", threads=2)
KS = [2, 4, 8]
N = 16                      # requests at once
ONE = 2                     # requests one at a time
OUTPUT = 64                 # tokens an answer: 63 of them made by decode rows
# three passes of every run, as factors of its median pass's tokens/s, in round order: in
# mini_engine the rounds' speed-ups are the median's x 0.96 / 1.02 = 0.941, x 1 and x 1.02 / 0.95
# = 1.074; vLLM's range is on's slowest over off's fastest, x 0.97 / 1.03 = 0.942, to on's
# fastest over off's slowest, x 1.01 / 0.98 = 1.031
ENGINE_OFF, ENGINE_ON = (1.02, 1.0, 0.95), (0.96, 1.0, 1.02)
VLLM_OFF, VLLM_ON = (0.98, 1.0, 1.03), (0.97, 1.0, 1.01)
# the summary's row of record(): copy one at a time at k = 4 100 / 40 = 2.5x (2.35-2.68), vLLM
# 160 / 64 = 2.5x (2.35-2.58); 16 chats at once at k = 4 256 / 320 = 0.80x (0.75-0.86)
SUMMARY_ROW = "copy 2.5x (2.4-2.7), vLLM 2.5x (2.4-2.6); 16 chat 0.80x (0.75-0.86)"

# the hand-made runs: (workload, at once?) -> k -> (tokens/s, the decoding rows by the tokens
# they gained: [1, 2, ..., k + 1], steps, guesses verified or None for k x rows). Each list adds
# up to every decoded token: 2 x 63 = 126 one at a time, 16 x 63 = 1,008 at once.
RUNS = {
    ("copy", False): {0: (40.0, [126], 128, None),
                      2: (80.0, [6, 15, 30], 53, None),              # 6 + 30 + 90 = 126
                      4: (100.0, [4, 2, 2, 3, 20], 33, None),        # 4 + 4 + 6 + 12 + 100
                      8: (80.0, [4, 2, 1, 2, 1, 1, 1, 1, 9], 25, None)},
    ("copy", True): {0: (320.0, [1008], 64, None),
                     2: (384.0, [48, 120, 240], 27, None),           # 48 + 240 + 720
                     4: (288.0, [32, 16, 16, 24, 160], 17, None),    # 32 + 32 + 48 + 96 + 800
                     8: (224.0, [32, 16, 8, 16, 8, 8, 8, 8, 72], 12, None)},
    ("chat", False): {0: (40.0, [126], 128, None),
                      2: (42.0, [100, 10, 2], 114, 60),             # 100 + 20 + 6
                      4: (40.8, [104, 6, 2, 1, 0], 115, 80),        # 104 + 12 + 6 + 4
                      8: (36.0, [106, 4, 1, 0, 0, 0, 0, 0, 1], 114, 96)},
    ("chat", True): {0: (320.0, [1008], 64, None),
                     2: (304.0, [840, 72, 8], 60, 500),             # 840 + 144 + 24
                     4: (256.0, [860, 50, 10, 2, 2], 58, 600),      # 860 + 100 + 30 + 8 + 10
                     8: (240.0, [878, 40, 8, 2, 0, 0, 0, 0, 2], 58, 800)},
}
# vLLM: (workload, at once?) -> (off tokens/s, on tokens/s, guesses, accepted, same text)
VLLM = {("copy", False): (64.0, 160.0, 124, 95, 2),
        ("copy", True): (278.0, 250.2, 1000, 700, 16),
        ("chat", False): (64.0, 60.8, 40, 4, 2),
        ("chat", True): (278.0, 222.4, 640, 64, 15)}
COPY_WORDS = (" The GNU General Public License is a free, copyleft license for software and "
              "other kinds of works. The licenses for most software and other practical works "
              "are designed to take away your freedom to share and change the works. By "
              "contrast, the GNU General Public License is intended to guarantee your freedom "
              "to share and change all versions of a program--to make sure it remains"
              ).split(" ")[1:]


def hand_engine(name: str, is_concurrent: bool, k: int) -> EngineRun:
    tokens_per_s, by_tokens, num_steps, drafted = RUNS[(name, is_concurrent)][k]
    count = N if is_concurrent else ONE
    accepted = sum(i * n for i, n in enumerate(by_tokens))
    # bf16 rounding: 2 of the 16 chats at once at k = 8 differ from off
    identical = count - 2 * ((name, is_concurrent, k) == ("chat", True, 8))
    return EngineRun(name, is_concurrent, count, k, count * OUTPUT / tokens_per_s,
                     count * OUTPUT, tokens_per_s, 1 / tokens_per_s * count * 0.9, num_steps,
                     k * sum(by_tokens) if drafted is None else drafted, accepted, by_tokens,
                     identical, [tokens_per_s * f for f in (ENGINE_ON if k else ENGINE_OFF)])


def hand_answer(name: str) -> Answer:
    """64 tokens: the first the model's own (from the prompt), then runs of accepted guesses,
    each ended by one of the model's own; the chat's a line break in it."""
    if name == "copy":
        words = [" " + w for w in COPY_WORDS][:OUTPUT]
        pattern = [False] + ([True] * 4 + [False]) * 12 + [True, True, False]
    else:
        words = ([" Sure", "!", "\n", "\n", "A", " large", " language", " model"]
                 + [" is", " a", " program", " that", " reads", " text", " and", " writes",
                    " more", " of", " it", "."] * 5)[:OUTPUT - 4] + [" It", " is", " a", " tool"]
        pattern = [False] * 60 + [True, False, True, False]
    assert len(words) == len(pattern) == OUTPUT
    return Answer(name, 4, words, pattern)


def hand_server(name: str, is_concurrent: bool, on: bool) -> ServerRun:
    off_tps, on_tps, drafted, accepted, same = VLLM[(name, is_concurrent)]
    count = N if is_concurrent else ONE
    tps = on_tps if on else off_tps
    level = LoadLevel(count, count, count * OUTPUT / tps, count * OUTPUT, tps, mean_tpot_s=0.015
                      if on else 0.03, is_concurrent=is_concurrent)
    passes = [tps * f for f in (VLLM_ON if on else VLLM_OFF)]
    if not on:
        return ServerRun(name, is_concurrent, 0, level, startup_s=12.0 if not is_concurrent and
                         name == "copy" else None, pass_tokens_per_s=passes)
    return ServerRun(name, is_concurrent, 4, level, drafted, accepted, same,
                     pass_tokens_per_s=passes)


def record(header: results.RunHeader | None = None) -> SpeculativeDecoding:
    """The defaults' run: k = 2, 4, 8 (vLLM 4), n-grams of 2-4, 16 at once, 2 one at a time, 64
    tokens an answer, three passes of each run (SUMMARY_ROW's comment works out its row)."""
    pairs = [(name, c) for name in ("copy", "chat") for c in (False, True)]
    return SpeculativeDecoding(
        Settings(ks=KS, vllm_k=4, prompt_lookup_min=2, prompt_lookup_max=4, num_requests=N,
                 num_sequential=ONE, output_tokens=OUTPUT, copy_window_tokens=120,
                 page_size_tokens=16, max_model_len=512, kv_cache_bytes=186_646_528, port=8000,
                 is_vllm_measured=True, num_passes=3),
        WorkloadShape(source="/usr/share/common-licenses/GPL-3", min_copy_prompt_tokens=158,
                      max_copy_prompt_tokens=163, min_chat_prompt_tokens=39,
                      max_chat_prompt_tokens=43),
        [Check("copy", 8, N, N, N * OUTPUT, N * OUTPUT, 628, 1154),
         Check("chat", 8, N, N, N * OUTPUT, N * OUTPUT, 40, 361)],
        [hand_engine(name, c, k) for name, c in pairs for k in [0, *KS]],
        [hand_answer("copy"), hand_answer("chat")],
        [hand_server(name, c, on) for on in (False, True) for name, c in pairs],
        header=header or HEADER)
