"""Task 10: Share the prefix - automatic prefix caching, built in mini_engine and measured in vLLM.

Page tables are an indirection, and tasks 3, 4 and 9 show what it buys first: no memory reserved
for tokens that never come. This task shows the second: requests that start with the same tokens
point their page tables at the same physical pages and skip computing them. Chat requests share
their system prompt; vLLM does this by default (automatic prefix caching). mini_engine does it too
(mini_engine/block_manager.py): hashed full blocks, ref counts, freed blocks kept in LRU order.

The workload: one shared system prompt (a real instruction text, through the model's chat
template) and the lab's distinct user questions, each answer a fixed number of tokens (EOS held
off); and a control workload of the same size whose prompts share no full page (each prompt's own
tokens in a shuffled order). It prints four parts:

1. Correct: the engine's tokens with and without the cache (all requests, greedy), and against
   transformers for a few requests (fp32).
2. The pages: the first requests' page tables at the peak, the shared pages marked, their ref
   counts, and the pages held with and without sharing.
3. Measured in mini_engine, cache off vs on: prompt tokens computed and taken from the cache, TTFT,
   tokens/s; then the control workload, what the cache costs when nothing hits.
4. vLLM: the same workload through the lab's server with prefix caching off
   (--no-enable-prefix-caching) and on (its default): TTFT, tokens/s, the hit rate read from
   /metrics; and the offline LLM.generate's RequestOutput.num_cached_tokens.

Every pair of runs, measured, printed and saved, is in one order: cache off, then cache on. This
file sets up and measures, then prints in that order; beside it in lessons/task_10/: the
workloads (workloads.py), the record and the summary's row (record.py), the printing and the
insights (report.py), the figure of the shared pages (figure.py).

    python task_10_prefix_caching.py [--requests 32] [--system-tokens 80] [--output 16]
        [--page-size 16] [--max-batch 16] [--no-vllm] [--port 8000] [--model M]
        [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import functools
import statistics
import time

from common import (cli, engine, figures, load, measure, memory, metrics, own_engines, results,
                    server, settings)
from lessons.task_10 import FIGURES
from lessons.task_10.record import (LABELS, Correctness, EngineRun, OfflineRequest, PageSnapshot,
                                    PrefixCaching, ServerRun, Settings)
from lessons.task_10.report import print_report, print_run_info
from lessons.task_10.workloads import (LONG_MAX_MODEL_LEN, Workload, chat_workload,
                                       choose_max_model_len, control_workload)
from mini_engine import EngineConfig, LLMEngine, Llama, StepProfiler

SCRIPT = "task_10_prefix_caching"
CHECK_REQUESTS = 3          # part 1: requests checked against transformers, fp32
NUM_TABLES = 4              # part 2: page tables shown


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    group.add_argument("--requests", type=cli.positive_int, default=32,
                       help="chat requests, all arriving at once (default 32)")
    group.add_argument("--system-tokens", type=cli.positive_int, default=80,
                       help="tokens of the shared system prompt, taken from the start of a "
                            "132-token instruction text (default 80; at least 16)")
    group.add_argument("--output", type=cli.positive_int, default=16,
                       help="tokens each answer generates, EOS held off (default 16)")
    group.add_argument("--seed", type=int, default=settings.SEED,
                       help=f"seed of the control workload's shuffles (default {settings.SEED})")
    group = parser.add_argument_group("engine")
    group.add_argument("--page-size", type=cli.positive_int, default=16,
                       help="tokens per KV block, mini_engine's and vLLM's (default 16); must "
                            f"divide {LONG_MAX_MODEL_LEN}")
    group.add_argument("--max-batch", type=cli.positive_int, default=16,
                       help="batch cap, mini_engine's and the server's max_num_seqs (default 16)")
    group.add_argument("--no-vllm", action="store_true", help="skip part 4 (vLLM)")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    cli.add_kernels_arg(parser)
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    if not 16 <= args.system_tokens <= 132:
        parser.error(f"--system-tokens {args.system_tokens}: the instruction text has 132 tokens; "
                     "choose 16 to 132")
    if LONG_MAX_MODEL_LEN % args.page_size:
        parser.error(f"--page-size {args.page_size} does not divide {LONG_MAX_MODEL_LEN}")
    return args


def settings_of(args, max_model_len: int) -> Settings:
    """The flags as the record saves them, with the max_model_len chosen for the workload."""
    return Settings(args.requests, args.system_tokens, args.output, args.seed, args.page_size,
                    args.max_batch, max_model_len, settings.KV_CACHE_BYTES, args.port,
                    not args.no_vllm, args.kernels)


# --- parts 1-3: mini_engine ----------------------------------------------------------------------
def run_engine(model: Llama, eos_ids, workload: Workload, s: Settings, caching: bool) -> EngineRun:
    """Every request added at once, stepped to the end; the page tables kept at the step that
    held the most pages."""
    eng = LLMEngine(model, eos_ids, EngineConfig(
        kv_bytes=s.kv_cache_bytes, page_size=s.page_size_tokens, max_batch=s.max_num_seqs,
        max_model_len=s.max_model_len, seed=s.seed, enable_prefix_caching=caching,
        kernels=s.kernels),
        profiler=StepProfiler())    # bookkeeping_s below is the steps' scheduling phase
    start = time.perf_counter()
    seqs = [eng.add_request(p, s.num_output_tokens, min_tokens=s.num_output_tokens)
            for p in workload.prompts]
    peak = None
    while eng.scheduler.has_work:
        eng.step()
        if peak is None or eng.block_manager.num_used > peak.num_pages_held:
            peak = page_snapshot(eng)
    seconds = time.perf_counter() - start
    ttfts = [q.ttft_s for q in seqs]
    run = EngineRun(LABELS[caching], seconds, len(seqs) * s.num_output_tokens / seconds,
                    eng.block_manager.num_query_tokens, eng.block_manager.num_hit_tokens,
                    statistics.mean(ttfts), load.percentile(ttfts, 95),
                    max(step.num_pages_used for step in eng.steps),
                    sum(step.phases["scheduling"] for step in eng.steps), peak)
    run.outputs = [q.output_ids for q in seqs]
    return run


def off_and_on(model: Llama, eos_ids, workload: Workload, s: Settings, passes: int = 1
               ) -> list[EngineRun]:
    """The cache off, then on, taking turns for `passes` passes; each way's median pass by
    tokens/s, kept whole, with every pass's tokens/s and mean TTFT beside it. Each pass is a
    new engine: its cache starts empty, so every pass finds the same hits."""
    ways = {caching: functools.partial(run_engine, model, eos_ids, workload, s, caching)
            for caching in (False, True)}            # off, then on: the order of every list
    found = measure.in_turns(ways, passes, warm_up=False)
    median = []
    for runs in found.values():
        run = measure.median_pass(runs, lambda r: r.tokens_per_s)
        if passes > 1:
            run.tokens_per_s_spread = measure.Spread.of(r.tokens_per_s for r in runs)
            run.ttft_spread = measure.Spread.of(r.mean_ttft_s for r in runs)
        median.append(run)
    return median


def page_snapshot(eng: LLMEngine) -> PageSnapshot:
    """The running requests' page tables now: the first NUM_TABLES in full, with each page's ref
    count, and the pages held against the pages the same tables would hold unshared."""
    running = eng.scheduler.running
    tables = {q.seq_id: list(q.page_table) for q in running[:NUM_TABLES]}
    return PageSnapshot(len(eng.steps), eng.block_manager.num_used,
                        sum(len(q.page_table) for q in running), len(running), tables,
                        {p: eng.block_manager.blocks[p].ref_count
                         for table in tables.values() for p in table})


def identical(a: EngineRun, b: EngineRun) -> int:
    return sum(x == y for x, y in zip(a.outputs, b.outputs))


def check_correct(model_path: str, tokenizer, eos_ids, workload: Workload, s: Settings
                  ) -> Correctness:
    """fp32, greedy: every request with the cache against the same without it, and the first
    few against transformers' generate. In fp32 a difference would be a bug; in bfloat16 the
    same K/V computed in another batch can round differently (part 3 counts it there)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = Llama(model_path, "float32")
    off, on = off_and_on(model, eos_ids, workload, s)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    num_hf = min(CHECK_REQUESTS, len(workload.prompts))
    same_as_hf = 0
    for p, output in zip(workload.prompts[:num_hf], on.outputs):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=s.num_output_tokens,
                              min_new_tokens=s.num_output_tokens, do_sample=False,
                              pad_token_id=tokenizer.eos_token_id)
        same_as_hf += ref[0, len(p):].tolist() == output
    return Correctness(len(workload.prompts), identical(off, on), on.cached_prompt_tokens,
                       on.prompt_tokens, num_hf, same_as_hf)


def measure_engine(model_path: str, dtype: str, eos_ids, workloads: tuple[Workload, ...],
                   s: Settings) -> list[list[EngineRun]]:
    """Parts 2-3: each workload with the cache off, then on, in turns for measure.PASSES passes."""
    model = Llama(model_path, dtype)
    runs = [off_and_on(model, eos_ids, w, s, measure.PASSES) for w in workloads]
    del model   # vLLM's engines need the memory
    memory.give_memory_back()
    return runs


# --- part 4: vLLM ------------------------------------------------------------------------------
def run_server(model_choice, dtype: str, workload: Workload, s: Settings, caching: bool
               ) -> ServerRun:
    """The lab's server with prefix caching off or on (restarted when it changes), one warm-up
    request that shares nothing with the workload, then every request at once, streamed."""
    config = server.ServerConfig(model_choice.path, model_choice.name, dtype,
                                 max_model_len=s.max_model_len, max_num_seqs=s.max_num_seqs,
                                 port=s.port, block_size=s.page_size_tokens,
                                 enable_prefix_caching=caching)
    srv = server.ensure_server(config, progress=server.in_report)
    load.run_level(srv.base_url, srv.model_name, [settings.PROMPT], 4)
    before = metrics.snapshot(metrics.fetch(srv.base_url), time.monotonic())
    level = load.run_level(srv.base_url, srv.model_name, workload.texts, s.num_output_tokens)
    after = metrics.snapshot(metrics.fetch(srv.base_url), time.monotonic())
    return ServerRun(LABELS[caching], level, round(after.prefix_queries - before.prefix_queries),
                     round(after.prefix_hits - before.prefix_hits), srv.startup_s)


def offline_cached_tokens(model_path: str, dtype: str, workload: Workload, s: Settings
                          ) -> dict[str, OfflineRequest]:
    """vllm.LLM (prefix caching on, its default): RequestOutput.num_cached_tokens of the first
    request, of a later one, and of the first one again."""
    eng = engine.start_engine(model_path, dtype, max_model_len=s.max_model_len,   # sets vLLM's
                              block_size=s.page_size_tokens, max_num_seqs=s.max_num_seqs)   # env
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=s.num_output_tokens,
                            min_tokens=s.num_output_tokens)
    later = min(len(workload.prompts) - 1, 1)
    cached = {}
    for label, i in (("first request", 0), (f"request {later + 1}", later),
                     ("first request again", 0)):
        out = eng.llm.generate([TokensPrompt(prompt_token_ids=workload.prompts[i])], params,
                               use_tqdm=False)[0]
        cached[label] = OfflineRequest(len(out.prompt_token_ids), out.num_cached_tokens)
    return cached


def measure_vllm(model_choice, dtype: str, chat: Workload, s: Settings):
    """Part 4: the server with the cache off, then on (stopped afterwards: this task started
    it), then the offline engine."""
    try:
        runs = [run_server(model_choice, dtype, chat, s, caching) for caching in (False, True)]
    finally:
        server.stop_server(s.port)
    return runs, offline_cached_tokens(model_choice.path, dtype, chat, s)


# --- the lesson ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> PrefixCaching:
    args = parse_args(argv)
    model_choice, dtype, tokenizer, eos_ids, progress, header = own_engines.start(args)
    chat = chat_workload(tokenizer, args.requests, args.system_tokens)
    control = control_workload(chat, args.page_size, args.seed)
    s = settings_of(args, choose_max_model_len(chat, args.output))
    print_run_info(model_choice, dtype, header.threads, s, chat.shape())

    progress("Part 1: cache on and off, transformers (fp32)...")
    correct = check_correct(model_choice.path, tokenizer, eos_ids, chat, s)
    progress("Parts 2-3: mini_engine, cache off and on...")
    runs, ctrl = measure_engine(model_choice.path, dtype.dtype, eos_ids, (chat, control), s)
    vllm = offline = None
    if s.is_vllm_measured:
        progress("Part 4: vLLM's server, cache off, then on; offline...")
        vllm, offline = measure_vllm(model_choice, dtype.dtype, chat, s)
    progress("done")

    record = PrefixCaching(s, chat.shape(), correct, identical(*runs), runs, ctrl, vllm, offline,
                           header=header)
    print_report(record)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sum(r.level.num_failed for r in vllm or []))
    return record


if __name__ == "__main__":
    cli.run(main)
