"""Long contexts: mini_engine against vLLM where attention, not the matmuls, takes the step.

The lab's workloads keep contexts short (at most 128 tokens in task 9). Here requests have random
prompts of up to --max-prompt tokens and make up to --max-output tokens each (EOS held off, so
every token asked for is made), through a step budget of 2,048 tokens, a batch cap of 16 and
128 MiB of KV cache (block 16, the lab's). Each way runs in a fresh process of its own, so that
neither way's memory, threads or compiled graphs are another's:

    mini-torch      mini_engine in plain torch (EngineConfig.kernels "torch"): every context
                    gathered, attention in calls of a bounded size, a prefill's queries in pieces
    mini-eager      mini_engine with its C kernels ("c"): every row, decode and prefill, attends
                    in one pass of C that reads the pages in place
    mini-compiled   the same, its decoder layers compiled ("compiled")
    vllm-eager      vLLM offline, enforce_eager=True (the lab's setting, the source's)
    vllm-compiled   vLLM offline, its default compilation on a CPU

Prefix caching is off in both engines (mini_engine's default; vLLM's is on): each pass runs the
same prompts, and a cache kept from the pass before would skip their prefill.

The ways take turns. Each process is started and set up in turn (model loaded, kernels chosen,
graphs compiled; one at a time, so that no set-up slows another), then waits; then each runs the
workload once, untimed, then TIMED_PASSES rounds in which every way runs it once more, one way
at a time (common/measure.py says why). Each way keeps its fastest timed pass. Ways timed one
after the other measured the hour as much as the engine: a ratio of two ways could come out on
either side of 1 (docs/measurements.md). mini_engine's eager ways also time attention with task
9's profiler. The ways' processes are all alive together, which takes more memory than the
lab's 3.5 GB budget (this is a benchmark, not a step of the lab), and each one's peak PSS is its
share of what they hold together (the libraries' pages they share are split among them), lower
than it would be alone. Prints one table; results/long_context.json keeps it.

    python benchmarks/long_context.py [--ways mini-eager,vllm-eager] [--requests 32]
        [--max-prompt 512] [--max-output 256] [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cli, measure, report, results, settings  # noqa: E402

SCRIPT = "long_context"
WAYS = ("mini-torch", "mini-eager", "mini-compiled", "vllm-eager", "vllm-compiled")
KERNELS = {"mini-torch": "torch", "mini-eager": "c", "mini-compiled": "compiled"}
DEFAULT_WAYS = ["mini-eager", "vllm-eager", "mini-compiled", "vllm-compiled"]   # eager, compiled
BUDGET = 2048            # tokens a step (max_num_batched_tokens)
MAX_BATCH = 16           # the lab's cap (max_num_seqs)
TIMED_PASSES = 2         # rounds timed after the untimed one; each way keeps its fastest
TIMEOUT_S = 1200         # one process's set-up, or one pass


@dataclass
class Way(results.Record):
    name: str
    tokens: int
    seconds: float
    tokens_per_s: float
    attention_s: float | None        # mini_engine eager: its profiler's attention, that pass
    preemptions: int | None
    peak_pss_bytes: int = 0
    pass_seconds: list[float] = field(default_factory=list)   # every timed pass, in turn


@dataclass
class LongContext(results.Record):
    header: results.RunHeader
    requests: int
    max_prompt: int
    max_output: int
    prompt_tokens: int
    ways: list[Way] = field(default_factory=list)


def workload(n: int, max_prompt: int, max_output: int, vocab: int) -> list[tuple[list, int]]:
    """n requests of random token ids (seeded), prompts of 1..max_prompt, outputs 1..max_output."""
    rng = random.Random(settings.SEED)
    return [([rng.randrange(100, vocab) for _ in range(rng.randint(1, max_prompt))],
             rng.randint(1, max_output)) for _ in range(n)]


# --- one way, in its own process ----------------------------------------------------------------
def mini_passes(args, work, way: str) -> Callable[[], dict]:
    """Set up mini_engine for this way (model, kernels, and for mini-compiled the graph, at the
    first engine's warm-up), and return what runs one pass of the workload on a new engine."""
    import torch

    from mini_engine import EngineConfig, LLMEngine, Llama, StepProfiler
    from mini_engine.engine import eos_token_ids

    torch.set_num_threads(settings.num_cores())
    model = Llama(args.model_path, args.dtype)
    config = EngineConfig(
        kv_bytes=settings.KV_CACHE_BYTES, page_size=settings.BLOCK_SIZE, max_batch=MAX_BATCH,
        max_model_len=args.max_prompt + args.max_output, max_num_batched_tokens=BUDGET,
        kernels=KERNELS[way])
    profiled = way != "mini-compiled"      # the compiled graph runs attention inside it
    eos = eos_token_ids(args.model_path)
    LLMEngine(model, eos, config).warm_up()        # compiles once, for the process

    def one_pass() -> dict:
        eng = LLMEngine(model, eos, config, profiler=StepProfiler() if profiled else None)
        eng.warm_up()
        start = time.perf_counter()
        for ids, n in work:
            eng.add_request(ids, n, min_tokens=n)
        seqs = eng.run()
        seconds = time.perf_counter() - start
        attention = (sum(s.phases.get("attention", 0.0) for s in eng.steps) if profiled
                     else None)
        return {"tokens": sum(len(s.output_ids) for s in seqs), "seconds": seconds,
                "attention_s": attention, "preemptions": eng.scheduler.num_preemptions}
    return one_pass


def vllm_passes(args, work, way: str) -> Callable[[], dict]:
    """Start vLLM offline for this way, and return what runs one pass of the workload."""
    settings.apply_cpu_engine_env()        # before vLLM (and torch) is imported
    if way == "vllm-compiled":
        os.environ.pop("TORCHDYNAMO_DISABLE", None)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model_path, seed=settings.SEED, dtype=args.dtype,
              max_model_len=args.max_prompt + args.max_output,
              kv_cache_memory_bytes=settings.KV_CACHE_BYTES, block_size=settings.BLOCK_SIZE,
              max_num_seqs=MAX_BATCH, max_num_batched_tokens=BUDGET,
              enforce_eager=way == "vllm-eager",
              # off, as in mini_engine: every pass runs the same prompts, and vLLM's cache
              # (on by default) would keep pages of the last pass's prompts to skip them
              enable_prefix_caching=False)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in work]
    params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n) for _, n in work]

    def one_pass() -> dict:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        return {"tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                "seconds": seconds, "attention_s": None, "preemptions": None}
    return one_pass


def child(args) -> None:
    """Set up, then run a pass each time the parent asks (common/measure.py's serve)."""
    from transformers import AutoConfig
    vocab = AutoConfig.from_pretrained(args.model_path).vocab_size
    work = workload(args.requests, args.max_prompt, args.max_output, vocab)
    measure.serve((vllm_passes if args.child.startswith("vllm") else mini_passes)(
        args, work, args.child))


def start(args, way: str) -> measure.Child:
    """This way's process (this file, --child), its memory sampled while it lives."""
    # the vLLM eager child sets TORCHDYNAMO_DISABLE itself; the others must not inherit it
    return measure.Child(way, [os.path.abspath(__file__), "--child", way, "--model-path",
                             args.model_path, "--dtype", args.dtype, "--requests",
                             str(args.requests), "--max-prompt", str(args.max_prompt),
                             "--max-output", str(args.max_output)],
                       TIMEOUT_S, unset=("TORCHDYNAMO_DISABLE",))


def take_turns(args, progress) -> list[Way]:
    """Every way set up in turn, then its passes taking turns with the others' (common/measure.py);
    each way's fastest timed pass, with all its timed passes."""
    children: list[measure.Child] = []
    try:
        for way in args.ways:
            progress(f"{way}: setting up, in a fresh process...")
            children.append(start(args, way))
            children[-1].ready()
        passes = measure.in_turns(
            {c.way: c.run_pass for c in children}, TIMED_PASSES,
            lambda way, round_: progress(f"{way}: pass {round_ + 1} of {TIMED_PASSES + 1}"
                                         + (" (untimed)" if round_ == 0 else "")))
    finally:
        for c in children:
            c.close()
    ways_ = []
    for c in children:
        best = min(passes[c.way], key=lambda p: p["seconds"])
        ways_.append(Way(c.way, best["tokens"], best["seconds"], best["tokens"] / best["seconds"],
                         best["attention_s"], best["preemptions"], c.peak_bytes,
                         [p["seconds"] for p in passes[c.way]]))
    return ways_


def ways(text: str) -> list[str]:
    chosen = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WAYS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(WAYS)}, not {text!r}")
    return chosen


def main(argv: list[str] | None = None) -> LongContext:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ways", type=ways, default=DEFAULT_WAYS,
                        help=f"comma-separated, of {', '.join(WAYS)} (default: "
                             f"{','.join(DEFAULT_WAYS)})")
    parser.add_argument("--requests", type=cli.positive_int, default=32)
    parser.add_argument("--max-prompt", type=cli.positive_int, default=512)
    parser.add_argument("--max-output", type=cli.positive_int, default=256)
    parser.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--model-path", help=argparse.SUPPRESS)
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    model_choice = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    args.model_path, args.dtype = model_choice.path, dtype.dtype
    header = results.RunHeader.of(model_choice, dtype, settings.num_cores())
    from transformers import AutoConfig
    work = workload(args.requests, args.max_prompt, args.max_output,
                    AutoConfig.from_pretrained(model_choice.path).vocab_size)
    record = LongContext(header, args.requests, args.max_prompt, args.max_output,
                         sum(len(ids) for ids, _ in work))
    progress = measure.progress_clock()
    record.ways = take_turns(args, progress)
    progress("done")
    print_table(record)
    results.save(SCRIPT, record)
    return record


def print_table(r: LongContext) -> None:
    h = r.header
    report.title("Long contexts: mini_engine against vLLM")
    report.row("Workload", f"{r.requests} requests at once, prompts of 1-{r.max_prompt} tokens "
               f"({r.prompt_tokens:,} in all), 1-{r.max_output} out, EOS held off")
    report.row("Engines", f"{h.model}, {h.dtype}, {h.threads} threads; budget {BUDGET}, cap "
               f"{MAX_BATCH}, {settings.KV_CACHE_BYTES >> 20} MiB of KV, block "
               f"{settings.BLOCK_SIZE}; each way in a fresh process, the ways taking turns, "
               f"the fastest of {TIMED_PASSES} timed passes each")
    report.table(["way", "tokens", "s", "tok/s", "attention s", "preempted", "GB"],
                 [(w.name, w.tokens, f"{w.seconds:.1f}", f"{w.tokens_per_s:.1f}",
                   "-" if w.attention_s is None else f"{w.attention_s:.1f}",
                   "-" if w.preemptions is None else w.preemptions,
                   f"{w.peak_pss_bytes / 1e9:.2f}") for w in r.ways],
                 [15, 7, 7, 8, 12, 10, 6])
    report.note("s: the fastest timed pass (all of them: results/long_context.json); "
                "attention s: mini_engine's profiler, that pass, eager ways; GB: the process's "
                "peak PSS, the ways' processes alive together (their shared pages split "
                "among them)")
    by = {w.name: w.tokens_per_s for w in r.ways}
    for mine, other in (("mini-eager", "vllm-eager"), ("mini-compiled", "vllm-compiled"),
                        ("mini-eager", "mini-torch")):
        if mine in by and other in by:
            report.row(f"{mine} / {other}", f"{by[mine] / by[other]:.2f}x")


if __name__ == "__main__":
    cli.run(main)
