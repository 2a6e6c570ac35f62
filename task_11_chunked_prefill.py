"""Task 11: One long prompt stalls everyone - chunked prefill and the step's token budget, built
in mini_engine and measured in vLLM.

vLLM V1 schedules tokens, not requests: each step has a budget of tokens (max_num_batched_tokens,
2048 for the server on a CPU). The running requests are served first, one token for each that is
decoding; a prompt's prefill takes what is left, cut into chunks across steps. Without chunking
a long prompt is computed whole in one step, and every request streaming its answer waits for
it. This task measures that stall, and what chunking costs the long prompt's own time to first
token (TTFT), in mini_engine (mini_engine/scheduler.py) and in vLLM's server.

The workload: a few short chat requests (the lab's questions, through the model's chat
template) streaming a fixed number of tokens, and long documents ("Summarise: " and about 1,200
tokens of the GPL-3 in /usr/share/common-licenses) that arrive while the chats decode. Each
setting runs it whole: no chunking (a prompt whole in one step, budget max_model_len), then each
budget of --budgets. It prints three parts:

1. Correct: every request's tokens at each budget against no chunking (greedy, fp32), and a chat
   and a long document against transformers.
2. Measured in mini_engine: the chats' gaps between tokens (mean, p99, the longest stall), the
   long documents' TTFT, tokens/s, steps, and the most tokens a step computed, by the budget.
3. vLLM: the same workload through the lab's server, restarted per setting
   (--no-enable-chunked-prefill, then --max-num-batched-tokens N): the same figures from the
   streamed tokens, and the steps from /metrics (vllm:iteration_tokens_total).

No chunking and the smallest budget, which the insight and the summary compare, run in --passes
passes in each engine (mini_engine's taking turns); each keeps its median pass by the stall.
The p99 gaps, vLLM's histogram, the passes' spreads and the server's start lines are printed
with --detail (make lab: on the report page); the JSON holds every figure.

This file sets up and measures, then prints; beside it in lessons/task_11/: the workload
(workloads.py), vLLM's staggered load and histogram (load.py), the record and the summary's row
(record.py), the printing and the insights (report.py), the figure of the steps and the stalls
(figure.py).

    python task_11_chunked_prefill.py [--budgets 512,256,128,64] [--chats 4] [--chat-output 64]
        [--long-docs 2] [--long-tokens 1200] [--long-output 16] [--no-vllm] [--port 8000]
        [--base-url URL] [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import time

from common import (cli, figures, load, measure, memory, metrics, own_engines, results, server,
                    settings)
from common.shape import ModelShape, max_model_len_for
from common.texts import source_text
from lessons.task_11 import FIGURES
from lessons.task_11.load import (iteration_tokens, prefill_steps, staggered_load,
                                  tokens_at_arrival)
from lessons.task_11.record import (ChunkedPrefill, Correctness, EngineRun, Latency, Passes,
                                    ServerRun, Settings, Timeline, label_of)
from lessons.task_11.report import print_report, print_run_info
from lessons.task_11.workloads import (LONG_DOCS, MAX_MODEL_LEN, Workload, check_fits,
                                       kv_budget_bytes, make_workload)
from mini_engine import EngineConfig, LLMEngine, Llama

SCRIPT = "task_11_chunked_prefill"
ARRIVE_AFTER_TOKENS = 8     # the long documents arrive once every chat has made this many
MAX_BUDGETS = 5             # the report's tables hold no chunking and 5 budgets


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    group.add_argument("--chats", type=cli.positive_int, default=4,
                       help="short chat requests, all arriving at once (default 4)")
    group.add_argument("--chat-output", type=cli.positive_int, default=64,
                       help="tokens each chat answer streams, EOS held off (default 64)")
    group.add_argument("--long-docs", type=cli.positive_int, default=2,
                       help="long documents, arriving together while the chats decode (default 2)")
    group.add_argument("--long-tokens", type=cli.positive_int, default=1200,
                       help="tokens of the text in each long document (default 1200)")
    group.add_argument("--long-output", type=cli.positive_int, default=16,
                       help="tokens each long document's answer makes (default 16)")
    group = parser.add_argument_group("engine")
    group.add_argument("--budgets", type=cli.int_list, default=[512, 256, 128, 64],
                       help="tokens a step (max_num_batched_tokens) of the chunked runs, after "
                            "one without chunking (default 512,256,128,64)")
    group.add_argument("--page-size", type=cli.positive_int, default=16,
                       help=f"tokens per KV page, mini_engine's and vLLM's (default 16); must "
                            f"divide {MAX_MODEL_LEN}")
    group.add_argument("--max-batch", type=cli.positive_int, default=16,
                       help="batch cap, mini_engine's and the server's max_num_seqs (default 16)")
    group.add_argument("--passes", type=cli.positive_int, default=measure.PASSES,
                       help=f"passes of no chunking and the smallest budget, the figures the "
                            f"insight compares, in each engine (default {measure.PASSES})")
    group.add_argument("--no-vllm", action="store_true", help="skip part 3 (vLLM)")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    group.add_argument("--base-url", default=None,
                       help="run part 3 against this vLLM server (e.g. on a GPU box) at its own "
                            "setting; the lab then starts and stops none")
    cli.add_kernels_arg(parser)
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    if len(args.budgets) > MAX_BUDGETS:
        parser.error(f"--budgets: at most {MAX_BUDGETS} budgets, not {len(args.budgets)}")
    if min(args.budgets) < args.max_batch:
        parser.error(f"--budgets {min(args.budgets)} is smaller than --max-batch "
                     f"{args.max_batch}: a step could not give each request a token (vLLM "
                     "refuses it too)")
    if args.chat_output <= ARRIVE_AFTER_TOKENS:
        parser.error(f"--chat-output {args.chat_output} must be over {ARRIVE_AFTER_TOKENS}: the "
                     f"long documents arrive after each chat's {ARRIVE_AFTER_TOKENS}th token")
    if args.max_batch > MAX_MODEL_LEN:
        parser.error(f"--max-batch {args.max_batch} is larger than max_model_len "
                     f"{MAX_MODEL_LEN}: without chunking a step could not give each request a "
                     "token")
    if args.base_url and args.no_vllm:
        parser.error("--base-url runs part 3, which --no-vllm leaves out: give one of them")
    if MAX_MODEL_LEN % args.page_size:
        parser.error(f"--page-size {args.page_size} does not divide {MAX_MODEL_LEN}")
    return args


def settings_of(args, model_path: str, w: Workload) -> Settings:
    """The flags as the record saves them, with the max_model_len and the KV budget chosen for
    the model and the workload (one line and exit 2 if a request cannot fit)."""
    max_model_len = max_model_len_for(model_path, MAX_MODEL_LEN)
    check_fits(w, args.chat_output, args.long_output, max_model_len)
    kv_bytes = kv_budget_bytes(w, args.chat_output, args.long_output, args.page_size,
                               ModelShape.from_folder(model_path).kv_bytes_per_token("float32"),
                               max_model_len)
    return Settings(args.chats, args.chat_output, args.long_docs, args.long_tokens,
                    args.long_output, ARRIVE_AFTER_TOKENS, args.budgets, args.page_size,
                    args.max_batch, max_model_len, kv_bytes, args.port, not args.no_vllm,
                    args.base_url, args.passes, args.kernels)


# --- parts 1-2: mini_engine ----------------------------------------------------------------------
def run_engine(model: Llama, eos_ids, w: Workload, s: Settings, budget: int | None) -> EngineRun:
    """The chats added at once and stepped until each has made ARRIVE_AFTER_TOKENS; then the
    long documents added; stepped to the end. budget None: no chunking."""
    chunked = budget is not None
    budget = budget or s.max_model_len   # without chunking a whole prompt must fit the budget
    eng = LLMEngine(model, eos_ids, EngineConfig(
        kv_bytes=s.kv_cache_bytes, page_size=s.page_size_tokens, max_batch=s.max_num_seqs,
        max_model_len=s.max_model_len, max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked, kernels=s.kernels))
    start = time.perf_counter()
    chats = [eng.add_request(p, s.chat_output_tokens, min_tokens=s.chat_output_tokens)
             for p in w.chat_prompts]
    while eng.scheduler.has_work and any(len(q.output_ids) < s.arrive_after_tokens and
                                         not q.is_finished for q in chats):
        eng.step()
    arrival = time.perf_counter()
    longs = [eng.add_request(p, s.long_output_tokens, min_tokens=s.long_output_tokens)
             for p in w.long_prompts]
    eng.run()
    seconds = time.perf_counter() - start
    chat_times = [[t - start for t in q.token_times_s] for q in chats]
    timeline = Timeline([st.num_decode_tokens for st in eng.steps],
                        [st.num_prefill_tokens for st in eng.steps],
                        [st.end_s - start for st in eng.steps], chat_times, arrival - start,
                        [q.first_token_s - start for q in longs])
    run = EngineRun(label_of(budget, chunked), budget, chunked,
                    Latency.of(chat_times, [q.ttft_s for q in longs]), seconds,
                    sum(len(q.output_ids) for q in eng.sequences) / seconds, len(eng.steps),
                    max(st.num_tokens for st in eng.steps), timeline)
    run.outputs = [q.output_ids for q in eng.sequences]
    return run


def sweep(model: Llama, eos_ids, w: Workload, s: Settings) -> list[EngineRun]:
    """No chunking, then each budget."""
    return [run_engine(model, eos_ids, w, s, budget) for budget in [None, *s.budgets_tokens]]


def median_pass(passes: list):
    """The pass of median longest stall, kept whole, with the spreads of every pass; a failed
    pass (no latency) is the one kept: it is the last."""
    if passes[-1].latency is None or len(passes) == 1:
        return passes[-1]
    kept = measure.median_pass(passes, lambda p: p.latency.max_itl_s)
    kept.passes = Passes.of([p.latency for p in passes])
    return kept


def with_passes(runs: list[EngineRun], run_again, num_passes: int) -> list[EngineRun]:
    """No chunking and the smallest budget (what the summary row and the insight compare) run
    again, taking turns, num_passes in all; each kept as its median pass."""
    ends = [0, min(range(1, len(runs)), key=lambda i: runs[i].budget_tokens)]
    found = {i: [runs[i]] for i in ends}
    for _ in range(num_passes - 1):
        for i in ends:
            found[i].append(run_again(runs[i]))
    return [median_pass(found[i]) if i in found else r for i, r in enumerate(runs)]


def identical(runs: list[EngineRun]) -> list[int]:
    """Per chunked run, the requests whose tokens are all those of the run without chunking."""
    return [sum(a == b for a, b in zip(runs[0].outputs, r.outputs)) for r in runs[1:]]


def check_correct(model_path: str, tokenizer, eos_ids, w: Workload, s: Settings) -> Correctness:
    """fp32, greedy: every budget against no chunking, then the first chat and the first long
    document of the smallest budget against transformers' generate."""
    import torch
    from transformers import AutoModelForCausalLM

    runs = sweep(Llama(model_path, "float32"), eos_ids, w, s)
    small = min(runs[1:], key=lambda r: r.budget_tokens)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    checked = [(w.chat_prompts[0], small.outputs[0], s.chat_output_tokens),
               (w.long_prompts[0], small.outputs[len(w.chat_prompts)], s.long_output_tokens)]
    same_as_hf = 0
    for prompt, output, n in checked:
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=tokenizer.eos_token_id)
        same_as_hf += ref[0, len(prompt):].tolist() == output
    return Correctness(len(w.prompts), identical(runs), len(checked), same_as_hf)


def measure_engine(model_path: str, dtype: str, eos_ids, w: Workload, s: Settings
                   ) -> list[EngineRun]:
    """Part 2, in the run's dtype."""
    model = Llama(model_path, dtype)
    runs = with_passes(sweep(model, eos_ids, w, s), lambda r: run_engine(
        model, eos_ids, w, s, r.budget_tokens if r.is_chunked else None), s.num_passes)
    del model   # vLLM's server needs the memory
    memory.give_memory_back()
    return runs


# --- part 3: vLLM --------------------------------------------------------------------------------
def server_run(srv, w: Workload, s: Settings, label: str, budget: int | None, chunked: bool
               ) -> ServerRun:
    """One warm-up request, then the staggered load, /metrics read before and after it."""
    load.run_level(srv.base_url, srv.model_name, [settings.PROMPT], 4)
    before = metrics.fetch(srv.base_url)
    chats, longs, seconds = staggered_load(
        srv.base_url, srv.model_name, w.chat_texts, w.long_texts, s.chat_output_tokens,
        s.long_output_tokens, s.arrive_after_tokens)
    steps = iteration_tokens(before, metrics.fetch(srv.base_url))
    level = load.LoadLevel.of(chats + longs, seconds)
    if level.num_failed:
        return ServerRun(label, budget, chunked, level, None, steps, startup_s=srv.startup_s)
    return ServerRun(label, budget, chunked, level,
                     Latency.of([r.token_times_s for r in chats], [r.ttft_s for r in longs]),
                     steps, prefill_steps(chats, longs), tokens_at_arrival(chats, longs),
                     srv.startup_s)


def run_server(model_choice, dtype: str, w: Workload, s: Settings, budget: int | None,
               progress) -> ServerRun:
    """The lab's server at this setting (restarted when it changes), prefix caching off: every
    run computes every prompt token."""
    chunked = budget is not None
    engine_args = (("--max-num-batched-tokens", str(budget)) if chunked else
                   ("--no-enable-chunked-prefill", "--max-num-batched-tokens",
                    str(s.max_model_len)))
    config = server.ServerConfig(model_choice.path, model_choice.name, dtype,
                                 max_model_len=s.max_model_len, max_num_seqs=s.max_num_seqs,
                                 kv_cache_bytes=s.kv_cache_bytes, port=s.port,
                                 block_size=s.page_size_tokens, enable_prefix_caching=False,
                                 engine_args=engine_args)
    progress(f"Part 3: vLLM's server, {label_of(budget or s.max_model_len, chunked)}...")
    srv = server.ensure_server(config, progress=server.in_report)
    # no chunking and the smallest budget, what the insight compares: in passes on this server
    passes = []
    for _ in range(s.num_passes if budget in (None, min(s.budgets_tokens)) else 1):
        passes.append(server_run(srv, w, s, label_of(budget or s.max_model_len, chunked),
                                 budget or s.max_model_len, chunked))
        if passes[-1].latency is None:
            break
    return median_pass(passes)


def measure_vllm(model_choice, dtype: str, w: Workload, s: Settings, progress
                 ) -> list[ServerRun]:
    """Part 3: --base-url's server as it is, or the lab's at each setting (stopped afterwards:
    this task started it)."""
    if s.base_url:
        return [server_run(server.external_server(s.base_url), w, s, label_of(None, True), None,
                           True)]
    try:
        return [run_server(model_choice, dtype, w, s, b, progress)
                for b in [None, *s.budgets_tokens]]
    finally:
        server.stop_server(s.port)


# --- the lesson --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> ChunkedPrefill:
    args = parse_args(argv)
    model_choice, dtype, tokenizer, eos_ids, progress, header = own_engines.start(args)
    w = make_workload(tokenizer, args.chats, args.long_docs, args.long_tokens)
    s = settings_of(args, model_choice.path, w)
    print_run_info(model_choice, dtype, header.threads, s, w.shape(),
                   source_text(LONG_DOCS)[2])

    progress("Part 1: each budget against no chunking (fp32)...")
    correct = check_correct(model_choice.path, tokenizer, eos_ids, w, s)
    progress("Part 2: mini_engine at each setting...")
    runs = measure_engine(model_choice.path, dtype.dtype, eos_ids, w, s)
    vllm = None
    if s.is_vllm_measured:
        if s.base_url:
            progress("Part 3: vLLM's server at its own setting...")
        vllm = measure_vllm(model_choice, dtype.dtype, w, s, progress)
    progress("done")

    record = ChunkedPrefill(s, w.shape(), correct, identical(runs), runs, vllm, header=header)
    print_report(record)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sum(r.level.num_failed for r in vllm or []))
    return record


if __name__ == "__main__":
    cli.run(main)
