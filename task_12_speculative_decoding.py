"""Task 12: Guess, then check - speculative decoding (n-gram prompt lookup), built in mini_engine
and measured in vLLM.

The source's one request got almost nothing from vLLM (1.1x). Speculative decoding bets that a
step of a few rows costs about what a step of one row costs (part 2 measures the step's time):
guess the next k tokens cheaply, check the request's last token and its k guesses in one forward,
keep the guesses the model agrees with (greedy: its argmax) and one token of its own: 1 to k + 1
tokens a step, greedy output unchanged. The guesses need no draft model: vLLM's `ngram` method
(prompt lookup decoding) proposes what followed the request's last n tokens earlier in its own
tokens (mini_engine/proposer.py, sampler.py's verify).

Two workloads, a fixed number of tokens an answer (EOS held off), greedy: copy ("Repeat the
following text exactly" and a window of the GPL-3), where the answer copies from its prompt; and
chat (the lab's questions), where it does not. Each one request at a time (two, one after the
other) and --requests at once, speculation off, then at each k of --k. It prints three parts:
1. Correct: every request's tokens at the largest k against speculation off (greedy, fp32).
2. Measured in mini_engine: the share of guesses accepted, the tokens a step, the time per output
   token, tokens/s and the speed-up (its median and range), by workload, level and k; off and
   each k take turns (common/measure.py: an untimed round, then --passes rounds).
3. vLLM: the same workloads through the lab's server, off, then on with --speculative-config
   {"method": "ngram", ...} at the middle k of --k, --passes times a level: the same figures, the
   accepted share from its own counters in /metrics, and whether the greedy text changed.

Each round's range, the time per output token, the tokens a step and the server's start lines
are printed with --detail (make lab: on the report page); the JSON holds every figure.

This file sets up and measures, then prints; beside it in lessons/task_12/: the workloads
(workloads.py), the record and the summary's row (record.py), the printing and the insights
(report.py), the figure of an answer's tokens and the speed-ups (figure.py).

    python task_12_speculative_decoding.py [--k 2,4,8] [--ngram 2,4] [--requests 16]
        [--output 64] [--passes 3] [--quick] [--no-vllm] [--port 8000] [--base-url URL]
        [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

from common import (cli, figures, load, measure, memory, metrics, own_engines, results, server,
                    settings)
from common.shape import ModelShape, max_model_len_for
from common.texts import source_text
from lessons.task_12 import FIGURES
from lessons.task_12.record import (WORKLOADS, Answer, Check, EngineRun, ServerRun, Settings,
                                    SpeculativeDecoding)
from lessons.task_12.report import print_report, print_run_info
from lessons.task_12.workloads import (COPY_WINDOWS, MAX_MODEL_LEN, Workload, check_fits,
                                       kv_budget_bytes, make_workload)
from mini_engine import EngineConfig, LLMEngine, Llama

SCRIPT = "task_12_speculative_decoding"
DEFAULTS = {"k": [2, 4, 8], "requests": 16, "output": 64, "passes": measure.PASSES}
QUICK = {"k": [4], "requests": 3, "output": 16, "passes": 1}   # --quick: smaller, one pass
WARM_UP_TOKENS = 8      # an answer in the untimed round: each way's steps, at a fraction of 64
NUM_SEQUENTIAL = 2      # the level of one request: this many, one after another
WINDOW_TOKENS = 120     # tokens of the text each copy prompt asks to repeat
PAGE_SIZE = 16          # mini_engine's pages and vLLM's blocks (the lab's, settings.BLOCK_SIZE)
MAX_KS = 4              # the report's tables hold speculation off and 4 values of k
# vLLM's counters of speculative decoding in /metrics (read on vllm 0.27.1's server)
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"


def ngram_range(text: str) -> tuple[int, int]:
    """'2,4' -> (2, 4): the proposer's shortest and longest n, 1 <= MIN <= MAX."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN,MAX (two numbers)")
    low, high = (cli.positive_int(p.strip()) for p in parts)
    if low > high:
        raise argparse.ArgumentTypeError(f"{text!r}: MIN is larger than MAX")
    return low, high


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    group.add_argument("--requests", type=cli.positive_int, default=None,
                       help=f"requests of each workload at once (default {DEFAULTS['requests']})")
    group.add_argument("--output", type=cli.positive_int, default=None,
                       help=f"tokens each answer makes, EOS held off (default "
                            f"{DEFAULTS['output']})")
    group.add_argument("--passes", type=cli.positive_int, default=None,
                       help="timed passes of every run, mini_engine's off and each k in turns "
                            f"after an untimed round (default {DEFAULTS['passes']})")
    group.add_argument("--quick", action="store_true",
                       help=f"a smaller run: --k {QUICK['k'][0]} --requests {QUICK['requests']} "
                            f"--output {QUICK['output']} --passes {QUICK['passes']} (flags given "
                            "win)")
    group = parser.add_argument_group("engine")
    group.add_argument("--k", type=cli.int_list, default=None,
                       help="guesses a decoding request verifies a step (num_speculative_tokens)"
                            ", each a run of mini_engine; vLLM runs the middle one (default "
                            f"{','.join(map(str, DEFAULTS['k']))})")
    group.add_argument("--ngram", type=ngram_range, default=(2, 4), metavar="MIN,MAX",
                       help="the n-gram proposer's shortest and longest n (prompt_lookup_min, "
                            "prompt_lookup_max; default 2,4)")
    group.add_argument("--no-vllm", action="store_true", help="skip part 3 (vLLM)")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    group.add_argument("--base-url", default=None,
                       help="run part 3 against this vLLM server (e.g. on a GPU box) at its own "
                            "setting; the lab then starts and stops none")
    cli.add_kernels_arg(parser)
    cli.add_model_args(parser)
    args = cli.fill_unset(parser.parse_args(argv), DEFAULTS, QUICK)
    if len(args.k) > MAX_KS:
        parser.error(f"--k: at most {MAX_KS} values, not {len(args.k)}")
    if len(set(args.k)) < len(args.k):
        parser.error(f"--k {','.join(map(str, args.k))} gives a value twice")
    if args.output < 2:
        parser.error("--output 1 leaves nothing to guess: an answer's first token comes from "
                     "its prompt, the guesses only after it")
    if args.base_url and args.no_vllm:
        parser.error("--base-url runs part 3, which --no-vllm leaves out: give one of them")
    return args


def settings_of(args, model_path: str, w: Workload) -> Settings:
    """The flags as the record saves them, with the max_model_len and the KV budget chosen for
    the model and the workload (one line and exit 2 if a request cannot fit)."""
    max_model_len = max_model_len_for(model_path, MAX_MODEL_LEN)
    check_fits(w, args.output, max_model_len)
    kv_bytes = kv_budget_bytes(w, args.output, max(args.k), PAGE_SIZE,
                               ModelShape.from_folder(model_path).kv_bytes_per_token("float32"),
                               max_model_len)
    return Settings(args.k, sorted(args.k)[len(args.k) // 2], *args.ngram, args.requests,
                    min(NUM_SEQUENTIAL, args.requests), args.output, WINDOW_TOKENS, PAGE_SIZE,
                    max_model_len, kv_bytes, args.port, not args.no_vllm, args.base_url,
                    args.passes, args.kernels)


# --- parts 1-2: mini_engine ----------------------------------------------------------------------
def steps_by_tokens(eng: LLMEngine, k: int) -> list[int]:
    """The decoding rows of every step by the tokens they gained: [gaining 1, ..., k + 1]. A
    request's first token comes from its prompt's last chunk: that row is no decode."""
    counts, started = [0] * (k + 1), set()
    for st in eng.steps:
        for seq_id, gained in zip(st.seq_ids, st.num_output_tokens):
            if gained and seq_id in started:
                counts[gained - 1] += 1
            elif gained:
                started.add(seq_id)
    return counts


def run_engine(model: Llama, eos_ids, prompts: list[list[int]], s: Settings, name: str,
               is_concurrent: bool, k: int, n: int | None = None) -> EngineRun:
    """The prompts all at once, or one after another, each answer n (s.output_tokens) long."""
    eng = LLMEngine(model, eos_ids, EngineConfig(
        kv_bytes=s.kv_cache_bytes, page_size=s.page_size_tokens, max_batch=s.num_requests,
        max_model_len=s.max_model_len, num_speculative_tokens=k,
        prompt_lookup_min=s.prompt_lookup_min, prompt_lookup_max=s.prompt_lookup_max,
        kernels=s.kernels))
    n = n or s.output_tokens
    start = time.perf_counter()
    for batch in ([prompts] if is_concurrent else [[p] for p in prompts]):
        for p in batch:
            eng.add_request(p, n, min_tokens=n)
        eng.run()
    seconds = time.perf_counter() - start
    seqs, steps = eng.sequences, eng.steps
    run = EngineRun(name, is_concurrent, len(prompts), k, seconds, len(prompts) * n,
                    len(prompts) * n / seconds,
                    statistics.fmean((q.finish_s - q.first_token_s) / (n - 1) for q in seqs),
                    len(steps), sum(st.num_draft_tokens for st in steps),
                    sum(st.num_accepted_tokens for st in steps), steps_by_tokens(eng, k))
    run.outputs = [q.output_ids for q in seqs]
    run.output_was_guess = [q.output_was_guess for q in seqs]
    return run


def check(off: EngineRun, on: EngineRun) -> Check:
    pairs = list(zip(off.outputs, on.outputs))
    return Check(on.workload, on.k, len(pairs), sum(a == b for a, b in pairs),
                 sum(map(len, off.outputs)), sum(x == y for a, b in pairs for x, y in zip(a, b)),
                 on.num_accepted_tokens, on.num_draft_tokens)


def check_correct(model_path: str, eos_ids, w: Workload, s: Settings) -> list[Check]:
    """fp32, greedy, every request of each workload at once: the largest k (the most guesses
    verified and rolled back) against speculation off. (Each k's tokens in the run's dtype are
    counted in part 2; tests/test_spec_decode.py searches many more k.)"""
    model = Llama(model_path, "float32")
    return [check(*(run_engine(model, eos_ids, w.prompts(name), s, name, True, k)
                    for k in (0, max(s.ks)))) for name in WORKLOADS]


def measure_engine(model_path: str, dtype: str, tokenizer, eos_ids, w: Workload, s: Settings,
                   progress) -> tuple[list[EngineRun], list[Answer]]:
    """Part 2, off and each k in turns at each workload and level; and the first answer of each
    workload alone at vLLM's k, token by token, for the figure."""
    model = Llama(model_path, dtype)
    n, short = s.num_requests, min(WARM_UP_TOKENS, s.output_tokens)
    runs, answers = [], []

    def way(name: str, is_concurrent: bool, count: int, k: int):
        """A pass of one way for measure.in_turns; its first call, the untimed round, is short."""
        calls = itertools.count()
        return lambda: run_engine(model, eos_ids, w.prompts(name)[:count], s, name, is_concurrent,
                                  k, s.output_tokens if next(calls) else short)
    for name in WORKLOADS:
        for is_concurrent, count in ((False, s.num_sequential), (True, n)):
            if (name, is_concurrent) == (WORKLOADS[0], False):
                progress("Part 2: mini_engine, each workload and level...")
            found = measure.in_turns({k: way(name, is_concurrent, count, k) for k in [0, *s.ks]},
                                     s.num_passes)
            off = EngineRun.median_of(found[0])
            for k in [0, *s.ks]:
                run = EngineRun.median_of(found[k])
                run.num_identical = sum(a == b for a, b in zip(off.outputs, run.outputs))
                runs.append(run)
                if k == s.vllm_k and not is_concurrent:
                    answers.append(Answer(name, k, [tokenizer.decode([t]) for t in
                                                    run.outputs[0]], run.output_was_guess[0]))
    del model   # vLLM's server needs the memory
    memory.give_memory_back()
    return runs, answers


# --- part 3: vLLM --------------------------------------------------------------------------------
def server_run(srv, w: Workload, s: Settings, name: str, is_concurrent: bool, k: int | None
               ) -> ServerRun:
    """One level of one workload, greedy, /metrics' speculation counters read around it."""
    prompts = w.texts(name)[:s.num_requests if is_concurrent else s.num_sequential]
    before = metrics.parse(metrics.fetch(srv.base_url))
    level = load.run_level(srv.base_url, srv.model_name, prompts, s.output_tokens,
                           is_concurrent, temperature=0)
    after = metrics.parse(metrics.fetch(srv.base_url))

    def counted(metric: str) -> int | None:
        return round(after[metric] - before.get(metric, 0.0)) if metric in after else None

    run = ServerRun(name, is_concurrent, k, level, counted(DRAFT_TOKENS),
                    counted(ACCEPTED_TOKENS))
    run.texts = [r.text for r in level.requests]
    return run


def server_runs(srv, w: Workload, s: Settings, k: int | None) -> list[ServerRun]:
    """A greedy warm-up request (the first one a server computes is slow), then each workload
    at each level, s.num_passes times, the levels taking turns."""
    load.run_level(srv.base_url, srv.model_name, w.copy_texts[:1], 8, temperature=0)
    levels = [(name, is_concurrent) for name in WORKLOADS for is_concurrent in (False, True)]
    passes = [[server_run(srv, w, s, *level, k) for level in levels] for _ in range(s.num_passes)]
    runs = [ServerRun.median_of(list(level)) for level in zip(*passes)]
    runs[0].startup_s = srv.startup_s
    return runs


def run_server(model_choice, dtype: str, w: Workload, s: Settings, k: int) -> list[ServerRun]:
    """The lab's server, speculation off (k 0) or on with vLLM's ngram method, prefix caching
    off: every run computes every prompt token."""
    spec = {"method": "ngram", "num_speculative_tokens": k,
            "prompt_lookup_max": s.prompt_lookup_max, "prompt_lookup_min": s.prompt_lookup_min}
    config = server.ServerConfig(model_choice.path, model_choice.name, dtype,
                                 max_model_len=s.max_model_len, max_num_seqs=s.num_requests,
                                 kv_cache_bytes=s.kv_cache_bytes, port=s.port,
                                 block_size=s.page_size_tokens, enable_prefix_caching=False,
                                 engine_args=("--speculative-config", json.dumps(spec)) if k
                                 else ())
    srv = server.ensure_server(config, progress=server.in_report)
    return server_runs(srv, w, s, k)


def measure_vllm(model_choice, dtype: str, w: Workload, s: Settings) -> list[ServerRun]:
    """Part 3: --base-url's server as it is, or the lab's off then on (stopped afterwards: this
    task started it); each greedy text on compared with off's."""
    if s.base_url:
        return server_runs(server.external_server(s.base_url), w, s, None)
    try:
        off, on = (run_server(model_choice, dtype, w, s, k) for k in (0, s.vllm_k))
    finally:
        server.stop_server(s.port)
    for a, b in zip(off, on):
        b.num_same_text = sum(x == y for x, y in zip(a.texts, b.texts))
    return off + on


# --- the lesson --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> SpeculativeDecoding:
    args = parse_args(argv)
    model_choice, dtype, tokenizer, eos_ids, progress, header = own_engines.start(args)
    w = make_workload(tokenizer, args.requests, WINDOW_TOKENS)
    s = settings_of(args, model_choice.path, w)
    print_run_info(model_choice, dtype, header.threads, s, w.shape(),
                   source_text(COPY_WINDOWS)[2])

    progress("Part 1: speculation on against off (fp32)...")
    correct = check_correct(model_choice.path, eos_ids, w, s)
    runs, answers = measure_engine(model_choice.path, dtype.dtype, tokenizer, eos_ids, w, s,
                                   progress)
    vllm = None
    if s.is_vllm_measured:
        progress("Part 3: vLLM's server, off and on...")
        vllm = measure_vllm(model_choice, dtype.dtype, w, s)
    progress("done")

    record = SpeculativeDecoding(s, w.shape(), correct, runs, answers, vllm, header=header)
    print_report(record)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sum(r.level.num_failed for r in vllm or []))
    return record


if __name__ == "__main__":
    cli.run(main)
