"""Task 10: Share the prefix - automatic prefix caching, built in mini_engine and measured in vLLM.

Page tables are an indirection, and tasks 3, 4 and 9 show what it buys first: no memory reserved
for tokens that never come. This task shows the second: requests that start with the same tokens
point their page tables at the same physical pages and skip computing them. Chat requests share
their system prompt; vLLM does this by default (automatic prefix caching). mini_engine does it too
(mini_engine/block_manager.py): hashed full pages, ref counts, freed pages kept in LRU order.

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
4. vLLM: the same workload through the lab's server with prefix caching on (its default) and off
   (--no-enable-prefix-caching): TTFT, tokens/s, the hit rate read from /metrics; and the offline
   LLM.generate's RequestOutput.num_cached_tokens.

    python task_10_prefix_caching.py [--requests 32] [--system-tokens 80] [--output 16]
        [--page-size 16] [--max-batch 16] [--no-vllm] [--port 8000] [--model M]
        [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import asdict, dataclass, field

from common import cli, engine, figures, load, metrics, report, results, server, settings
from mini_engine import LLMEngine, Llama
from mini_engine.engine import eos_token_ids

SCRIPT = "task_10_prefix_caching"
# A real instruction text, a teaching assistant's system prompt (132 tokens with SmolLM's
# tokenizer); --system-tokens keeps its first N tokens.
SYSTEM_TEXT = (
    "You are a patient teaching assistant for a course on machine learning systems. Answer the "
    "student's question in two or three short sentences of plain English. Define any technical "
    "term the first time you use it, prefer a concrete example to an abstract one, and say plainly "
    "when you are not sure. Do not use lists, tables or code unless the student asks for them. If "
    "the question rests on a mistaken idea, correct it gently before you answer. When numbers "
    "help, give one rough figure with its unit rather than a range of guesses. Keep the tone "
    "friendly and direct, and end with one sentence that connects the answer to how language "
    "models are served in practice.")
CHECK_REQUESTS = 3          # part 1: requests checked against transformers, fp32
NUM_TABLES = 4              # part 2: page tables shown
LONG_MAX_MODEL_LEN = 256    # when the lab's 128 cannot hold system prompt + question + answer


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
                       help="tokens per KV page, mini_engine's and vLLM's (default 16); must "
                            f"divide {LONG_MAX_MODEL_LEN}")
    group.add_argument("--max-batch", type=cli.positive_int, default=16,
                       help="batch cap, mini_engine's and the server's max_num_seqs (default 16)")
    group.add_argument("--no-vllm", action="store_true", help="skip part 4 (vLLM)")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    if not 16 <= args.system_tokens <= 132:
        parser.error(f"--system-tokens {args.system_tokens}: the instruction text has 132 tokens; "
                     "choose 16 to 132")
    if LONG_MAX_MODEL_LEN % args.page_size:
        parser.error(f"--page-size {args.page_size} does not divide {LONG_MAX_MODEL_LEN}")
    return args


# --- the workloads -----------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    prompts: list[list[int]]            # token ids, as the tokenizer makes them from texts
    texts: list[str]                    # the same prompts as text, for the server
    shared_tokens: int                  # tokens every prompt starts with

    @property
    def num_prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))


def common_prefix(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def chat_workload(tokenizer, num_requests: int, system_tokens: int) -> Workload:
    """The system prompt's first system_tokens tokens, then each of the lab's user questions,
    through the model's chat template."""
    ids = tokenizer(SYSTEM_TEXT, add_special_tokens=False)["input_ids"][:system_tokens]
    system = tokenizer.decode(ids)
    texts = [tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        add_generation_prompt=True, tokenize=False) for question in load.user_prompts(num_requests)]
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    return Workload("chat", prompts, texts, common_prefix(prompts) if num_requests > 1 else 0)


def control_workload(chat: Workload, page_size: int, seed: int) -> Workload:
    """The same prompts, each one's tokens shuffled: the same lengths and the same tokens to
    compute, and no two prompts sharing their first page, so no full page is ever shared."""
    rng = random.Random(seed)
    while True:
        prompts = [rng.sample(p, len(p)) for p in chat.prompts]
        if len({tuple(p[:page_size]) for p in prompts}) == len(prompts):
            return Workload("control", prompts, [], common_prefix(prompts))


# --- parts 1-3: mini_engine ----------------------------------------------------------------------
@dataclass
class EngineRun:
    label: str
    seconds: float
    tokens_per_s: float
    prompt_tokens: int
    cached_prompt_tokens: int
    mean_ttft_s: float
    p95_ttft_s: float
    peak_pages: int
    bookkeeping_s: float       # the steps' scheduling phase: admission, cache look-ups, hashing
    peak: dict = field(default_factory=dict)       # the page tables at the most pages held
    outputs: list = field(default_factory=list, repr=False)

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens


def run_engine(model: Llama, eos_ids, workload: Workload, args, max_model_len: int,
               caching: bool, label: str) -> EngineRun:
    """Every request added at once, stepped to the end; the page tables kept at the step that
    held the most pages."""
    eng = LLMEngine(model, eos_ids, settings.KV_CACHE_BYTES, args.page_size, args.max_batch,
                    max_model_len, seed=args.seed, enable_prefix_caching=caching)
    start = time.perf_counter()
    seqs = [eng.add_request(p, args.output, min_tokens=args.output) for p in workload.prompts]
    peak = {"pages_held": -1}
    while eng.scheduler.has_work:
        eng.step()
        if eng.block_manager.num_used > peak["pages_held"]:
            peak = page_snapshot(eng)
    seconds = time.perf_counter() - start
    bm = eng.block_manager
    return EngineRun(label, seconds, len(seqs) * args.output / seconds, bm.num_query_tokens,
                     bm.num_hit_tokens, statistics.mean(s.ttft_s for s in seqs),
                     load.percentile([s.ttft_s for s in seqs], 95),
                     max(s.num_pages_used for s in eng.steps),
                     sum(s.phases["scheduling"] for s in eng.steps), peak,
                     [s.output_ids for s in seqs])


def off_and_on(model: Llama, eos_ids, workload: Workload, args, max_model_len: int
               ) -> list[EngineRun]:
    return [run_engine(model, eos_ids, workload, args, max_model_len, caching, label)
            for caching, label in ((False, "cache off"), (True, "cache on"))]


def page_snapshot(eng: LLMEngine) -> dict:
    """The running requests' page tables now: the first NUM_TABLES in full, with each page's ref
    count, and the pages held against the pages the same tables would hold unshared."""
    running = eng.scheduler.running
    tables = {s.seq_id: list(s.page_table) for s in running[:NUM_TABLES]}
    return {"step": len(eng.steps), "pages_held": eng.block_manager.num_used,
            "pages_unshared": sum(len(s.page_table) for s in running), "running": len(running),
            "tables": tables,
            "ref_counts": {p: eng.block_manager.blocks[p].ref_count
                           for table in tables.values() for p in table}}


def check_correct(model_path: str, tokenizer, eos_ids, workload: Workload, args,
                  max_model_len: int) -> dict:
    """fp32, greedy: every request with the cache against the same without it, and the first
    few against transformers' generate. In fp32 a difference would be a bug; in bfloat16 the
    same K/V computed in another batch can round differently (part 3 counts it there)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = Llama(model_path, "float32", linear="F.linear")   # speed does not matter here
    off, on = (run_engine(model, eos_ids, workload, args, max_model_len, c, "")
               for c in (False, True))
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    num_hf = min(CHECK_REQUESTS, len(workload.prompts))
    same_as_hf = 0
    for p, output in zip(workload.prompts[:num_hf], on.outputs):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=args.output,
                              min_new_tokens=args.output, do_sample=False,
                              pad_token_id=tokenizer.eos_token_id)
        same_as_hf += ref[0, len(p):].tolist() == output
    return {"num_requests": len(workload.prompts), "num_identical": identical(off, on),
            "cached_prompt_tokens": on.cached_prompt_tokens, "prompt_tokens": on.prompt_tokens,
            "num_checked_hf": num_hf, "num_identical_hf": same_as_hf}


def identical(a: EngineRun, b: EngineRun) -> int:
    return sum(x == y for x, y in zip(a.outputs, b.outputs))


# --- part 4: vLLM ------------------------------------------------------------------------------
@dataclass
class ServerRun:
    label: str
    tokens_per_s: float
    seconds: float
    mean_ttft_s: float
    p95_ttft_s: float
    succeeded: int
    failed: int
    queries: float              # change of vllm:prefix_cache_queries over the load (tokens)
    hits: float                 # change of vllm:prefix_cache_hits
    startup_s: float | None
    errors: list = field(default_factory=list)

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.queries if self.queries else None


def run_server(model_choice, dtype: str, workload: Workload, args, max_model_len: int,
               caching: bool) -> ServerRun:
    """The lab's server with prefix caching on or off (restarted when it changes), one warm-up
    request that shares nothing with the workload, then every request at once, streamed."""
    config = server.ServerConfig(model_choice.path, model_choice.name, dtype,
                                 max_model_len=max_model_len, max_num_seqs=args.max_batch,
                                 port=args.port, block_size=args.page_size,
                                 enable_prefix_caching=caching)
    srv = server.ensure_server(config, progress=lambda line: report.note(line, indent=2))
    load.run_level(srv.base_url, srv.model_name, [settings.PROMPT], 4)
    before = metrics.snapshot(metrics.fetch(srv.base_url), time.monotonic())
    level = load.run_level(srv.base_url, srv.model_name, workload.texts, args.output)
    after = metrics.snapshot(metrics.fetch(srv.base_url), time.monotonic())
    ttfts = [r.ttft_s for r in level.ok] or [0.0]
    return ServerRun("cache on" if caching else "cache off", level.throughput, level.duration_s,
                     statistics.mean(ttfts), load.percentile(ttfts, 95), len(level.ok),
                     level.num_failed, after.prefix_queries - before.prefix_queries,
                     after.prefix_hits - before.prefix_hits, srv.startup_s, level.errors)


def offline_cached_tokens(model_path: str, dtype: str, workload: Workload, args,
                          max_model_len: int) -> dict:
    """vllm.LLM (prefix caching on, its default): RequestOutput.num_cached_tokens of the first
    request, of a later one, and of the first one again."""
    eng = engine.start_engine(model_path, dtype, max_model_len=max_model_len,   # sets vLLM's
                              block_size=args.page_size, max_num_seqs=args.max_batch)   # env
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=args.output, min_tokens=args.output)
    later = min(len(workload.prompts) - 1, 1)
    order = [("first request", 0), (f"request {later + 1}", later), ("first request again", 0)]
    cached = {}
    for label, i in order:
        out = eng.llm.generate([TokensPrompt(prompt_token_ids=workload.prompts[i])], params,
                               use_tqdm=False)[0]
        cached[label] = {"prompt_tokens": len(out.prompt_token_ids),
                         "num_cached_tokens": out.num_cached_tokens}
    return cached


# --- the report ----------------------------------------------------------------------------------
def print_correct(c: dict) -> None:
    report.section("1. CORRECT: the cache changes no token (fp32, greedy)")
    report.row("Cache on vs off", f"{c['num_identical']}/{c['num_requests']} requests "
                                  f"identical, every token ({c['cached_prompt_tokens']:,} of "
                                  f"{c['prompt_tokens']:,} prompt tokens from the cache)")
    report.row("Against transformers", f"{c['num_identical_hf']}/{c['num_checked_hf']} "
                                       "identical (the first requests, cache on)")


def print_pages(on: EngineRun, off: EngineRun) -> None:
    peak = on.peak
    report.section(f"2. THE PAGES (cache on, step {peak['step']}, most pages held)")
    shared = {p for p, n in peak["ref_counts"].items() if n > 1}
    for seq_id, table in peak["tables"].items():
        report.row(f"Request {seq_id + 1} page table",
                   " ".join(f"{p}*" if p in shared else str(p) for p in table))
    counts = sorted({(p, peak["ref_counts"][p]) for p in shared})
    report.row("Ref counts (* shared)", ", ".join(f"page {p}: {n}" for p, n in counts) or "none")
    report.row("Pages held then", f"{peak['pages_held']} for {peak['running']} running requests, "
                                  f"{peak['pages_unshared']} if each held its own")
    report.row("Peak pages in use", f"{on.peak_pages} with the cache, {off.peak_pages} without")


def print_measured(runs: list[EngineRun], control: list[EngineRun]) -> None:
    report.section("3. MEASURED IN mini_engine (cache off vs on)")
    headers, widths = ["Chat workload", *(r.label for r in runs)], [33, 16, 16]
    report.table(headers, [
        ("Prompt tokens computed", *(f"{r.computed_prompt_tokens:,}" for r in runs)),
        ("  taken from the cache", *(f"{r.cached_prompt_tokens:,}" for r in runs)),
        ("Hit rate (prompt tokens)", *(f"{100 * r.hit_rate:.1f}%" for r in runs)),
        ("TTFT mean (s)", *(f"{r.mean_ttft_s:.2f}" for r in runs)),
        ("TTFT p95 (s)", *(f"{r.p95_ttft_s:.2f}" for r in runs)),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
        ("Time (s)", *(f"{r.seconds:.2f}" for r in runs)),
        ("Peak pages in use", *(r.peak_pages for r in runs)),
        ("Outputs as cache off", "", f"{identical(*runs)}/{len(runs[0].outputs)}")], widths)
    print()
    report.table(["Control (no page shared)", *(r.label for r in control)], [
        ("Hit rate (prompt tokens)", *(f"{100 * r.hit_rate:.1f}%" for r in control)),
        ("TTFT mean (s)", *(f"{r.mean_ttft_s:.2f}" for r in control)),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in control)),
        ("Time (s)", *(f"{r.seconds:.2f}" for r in control)),
        ("  of it scheduling (ms)", *(f"{1000 * r.bookkeeping_s:.0f}" for r in control))], widths)
    report.note("Scheduling: admission, the cache's look-ups and page hashes, the page tables")


def print_vllm(runs: list[ServerRun], offline: dict, workload: Workload, page_size: int) -> None:
    report.section("4. vLLM: THE SAME WORKLOAD THROUGH THE LAB'S SERVER")
    report.table(["Streamed, all at once", *(r.label for r in runs)], [
        ("TTFT mean (s)", *(f"{r.mean_ttft_s:.2f}" for r in runs)),
        ("TTFT p95 (s)", *(f"{r.p95_ttft_s:.2f}" for r in runs)),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
        ("Prefix cache hits (tokens)", *(f"{r.hits:,.0f}" for r in runs)),
        ("  of queries (tokens)", *(f"{r.queries:,.0f}" for r in runs)),
        ("Hit rate (/metrics)", *("-" if r.hit_rate is None else f"{100 * r.hit_rate:.1f}%"
                                  for r in runs)),
        ("Succeeded", *(f"{r.succeeded}/{r.succeeded + r.failed}" for r in runs))], [33, 16, 16])
    blocks = workload.shared_tokens // page_size
    n = len(workload.prompts)
    report.note(f"Why under 100%: every prompt starts with the same {workload.shared_tokens} "
                f"tokens, {blocks} whole blocks of {page_size} ({blocks * page_size} tokens); only "
                f"whole blocks are cached, and the first request computes them, so at most "
                f"{n - 1} x {blocks * page_size} = {(n - 1) * blocks * page_size:,} of "
                f"{workload.num_prompt_tokens:,} prompt tokens can hit "
                f"({100 * (n - 1) * blocks * page_size / workload.num_prompt_tokens:.1f}%). A "
                "prompt found whole in the cache still computes its last block: its last "
                "token's logits pick the next token.")
    report.note("Offline LLM.generate, RequestOutput.num_cached_tokens: " + "; ".join(
        f"{label} {c['num_cached_tokens']} of {c['prompt_tokens']}" for label, c in offline.items()))


def insights(correct: dict, runs: list[EngineRun], control: list[EngineRun],
             workload: Workload, page_size: int, dtype: str,
             vllm: list[ServerRun] | None) -> list[str]:
    off, on = runs
    n = correct["num_requests"]
    lines = [f"The cache changed no token: {n}/{n} requests identical in fp32"
             if correct["num_identical"] == n else
             f"{n - correct['num_identical']} of {n} requests differ with the cache in fp32: a bug"]
    same = identical(off, on)
    if same < n:
        lines.append(f"In {dtype}, {same}/{n} matched; fp32 matched "
                     f"{correct['num_identical']}/{n}, so the difference is rounding (the same "
                     f"K/V computed in another batch rounds differently in {dtype}), "
                     "not the cache's bookkeeping")
    fewer = 100 * (1 - on.computed_prompt_tokens / off.computed_prompt_tokens)
    whole = workload.shared_tokens // page_size * page_size
    lines.append(f"Sharing the system prompt's pages cut the prompt tokens computed by {fewer:.0f}% "
                 f"(each prompt shares {workload.shared_tokens} tokens, {whole} of them in whole "
                 f"pages): TTFT mean {off.mean_ttft_s:.2f} -> {on.mean_ttft_s:.2f} s, "
                 f"{on.tokens_per_s / off.tokens_per_s:.2f}x tokens/s")
    lines.append(f"Pages held at the peak: {on.peak_pages} with sharing, {off.peak_pages} without: "
                 f"the same KV budget holds {off.peak_pages / on.peak_pages:.1f}x these requests")
    c_off, c_on = control
    change = 100 * (c_on.tokens_per_s / c_off.tokens_per_s - 1)
    lines.append(f"When nothing hits, the cache on ran at {c_on.tokens_per_s:.1f} tokens/s against "
                 f"{c_off.tokens_per_s:.1f} ({change:+.1f}%, one run each); its bookkeeping took "
                 f"{1000 * c_on.bookkeeping_s:.0f} ms of {c_on.seconds:.1f} s "
                 f"({1000 * c_off.bookkeeping_s:.0f} ms with the cache off)"
                 + (": the gap is run-to-run noise, not the cache"
                    if abs(c_on.bookkeeping_s - c_off.bookkeeping_s) < 0.01 * c_on.seconds
                    < abs(c_on.seconds - c_off.seconds) else ""))
    if vllm and vllm[0].hit_rate is not None:
        on_v, off_v = vllm
        lines.append(f"vLLM found {100 * on_v.hit_rate:.0f}% of the prompt tokens in its cache: "
                     f"TTFT mean {off_v.mean_ttft_s:.2f} -> {on_v.mean_ttft_s:.2f} s, "
                     f"{on_v.tokens_per_s / off_v.tokens_per_s:.2f}x tokens/s")
    return lines


def choose_max_model_len(workload: Workload, output: int) -> int:
    """The lab's 128 when the longest prompt and its answer fit, else 256 (vLLM refuses a prompt
    that cannot fit; mini_engine the same)."""
    need = max(map(len, workload.prompts)) + output
    if need > LONG_MAX_MODEL_LEN:
        cli.fail(f"the longest prompt ({need - output} tokens) and --output {output} exceed "
                 f"max_model_len {LONG_MAX_MODEL_LEN}: lower --system-tokens or --output")
    return settings.MAX_MODEL_LEN if need <= settings.MAX_MODEL_LEN else LONG_MAX_MODEL_LEN


def measure_vllm(model_choice, dtype: str, chat: Workload, args, max_model_len: int):
    """Part 4: the server with the cache on, then off (stopped afterwards: this task started it),
    then the offline engine."""
    try:
        runs = [run_server(model_choice, dtype, chat, args, max_model_len, caching)
                for caching in (True, False)]
    finally:
        server.stop_server(args.port)
    return runs, offline_cached_tokens(model_choice.path, dtype, chat, args, max_model_len)


def print_run_info(model_choice, dtype, chat: Workload, args, max_len: int) -> None:
    import torch

    long = "" if max_len == settings.MAX_MODEL_LEN else " (the lab's 128 cannot hold it all)"
    report.title("Task 10: Share the Prefix - Prefix Caching")
    report.run_info(model_choice, dtype, torch.get_num_threads(),
                    Engine=f"mini_engine and vLLM, max_model_len={max_len}{long}, KV "
                           f"{settings.KV_CACHE_BYTES:,} B, pages of {args.page_size}, batch cap "
                           f"{args.max_batch}, greedy",
                    Workload=f"{args.requests} chat requests: a {args.system_tokens}-token system "
                             f"prompt + a question ({min(map(len, chat.prompts))}-"
                             f"{max(map(len, chat.prompts))} tokens, {chat.shared_tokens} shared), "
                             f"{args.output} new tokens each")


def result(args, max_len: int, chat: Workload, correct: dict, runs: list[EngineRun],
           control: list[EngineRun], vllm: list[ServerRun] | None, offline: dict | None) -> dict:
    """What task 10 saves (the page tables of part 2 included, for its figure)."""
    def plain(run: EngineRun, peak: bool = True) -> dict:
        return {**asdict(run), "outputs": None, "peak": run.peak if peak else None,
                "hit_rate": run.hit_rate, "computed_prompt_tokens": run.computed_prompt_tokens}

    return {"settings": {**vars(args), "max_model_len": max_len},
            "shared_tokens": chat.shared_tokens, "prompt_tokens": chat.num_prompt_tokens,
            "correct": correct, "identical_in_dtype": identical(*runs),
            "mini_engine": [plain(r) for r in runs], "control": [plain(r, False) for r in control],
            "vllm": [{**asdict(r), "hit_rate": r.hit_rate} for r in vllm] if vllm else None,
            "offline": offline, "hit_rate": runs[1].hit_rate,
            "ttft_off_s": runs[0].mean_ttft_s, "ttft_on_s": runs[1].mean_ttft_s,
            "vllm_hit_rate": vllm[0].hit_rate if vllm else None}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model_choice = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(settings.num_cores())
    tokenizer = AutoTokenizer.from_pretrained(model_choice.path)
    chat = chat_workload(tokenizer, args.requests, args.system_tokens)
    control, max_len = control_workload(chat, args.page_size, args.seed), \
        choose_max_model_len(chat, args.output)
    eos_ids, progress = eos_token_ids(model_choice.path), report.progress_clock()
    print_run_info(model_choice, dtype, chat, args, max_len)

    progress("Part 1: cache on and off, transformers (fp32)...")
    correct = check_correct(model_choice.path, tokenizer, eos_ids, chat, args, max_len)
    progress("Parts 2-3: mini_engine, cache off and on...")
    model = Llama(model_choice.path, dtype.dtype, (1, args.max_batch))
    runs, ctrl = (off_and_on(model, eos_ids, w, args, max_len) for w in (chat, control))
    del model   # vLLM's engines need the memory
    gc.collect()
    vllm = offline = None
    if not args.no_vllm:
        progress("Part 4: vLLM's server, cache on, then off; offline...")
        vllm, offline = measure_vllm(model_choice, dtype.dtype, chat, args, max_len)
    progress("done")

    print_correct(correct)
    print_pages(runs[1], runs[0])
    print_measured(runs, ctrl)
    if vllm:
        print_vllm(vllm, offline, chat, args.page_size)
    report.insight(insights(correct, runs, ctrl, chat, args.page_size, dtype.dtype, vllm))
    data = result(args, max_len, chat, correct, runs, ctrl, vllm, offline)
    header = results.RunHeader.of(model_choice, dtype, torch.get_num_threads())
    figures.saved(results.save(SCRIPT, header, results.PrefixCaching.from_dict(data)))
    cli.fail_if_any_failed(sum(r.failed for r in vllm or []))
    return header.__dict__ | data


if __name__ == "__main__":
    cli.run(main)
