"""Long contexts: mini_engine against vLLM where attention, not the matmuls, takes the step.

The lab's workloads keep contexts short (at most 128 tokens in task 9). Here requests have random
prompts of up to --max-prompt tokens and make up to --max-output tokens each (EOS held off, so
every token asked for is made), through a step budget of 2,048 tokens, a batch cap of 16 and
128 MiB of KV cache (block 16, the lab's). Each way runs in a fresh process of its own, so that
neither way's memory, threads or compiled graphs are another's:

    mini-one-call   mini_engine eager, each kind of row (decode, prefill) gathering its context
                    and attending in one call, padded to its longest context: the engine before
                    issue 29
    mini-gather     mini_engine eager, every context gathered, attention in calls of at most
                    2,048 context slots (EngineConfig.attention_call_slots): decode_in_place off
    mini-eager      mini_engine eager as it runs by default: decode rows attend in one pass of C
                    that reads the pages in place (EngineConfig.decode_in_place), prefill rows as
                    mini-gather
    mini-compiled   the same, its decoder layers compiled (EngineConfig.compile_model)
    vllm-eager      vLLM offline, enforce_eager=True (the lab's setting, the source's)
    vllm-compiled   vLLM offline, its default compilation on a CPU

Each way runs the workload twice and times the second pass (the first pass of a process runs
slower: docs/measurements.md, issue 29), and mini_engine's eager ways also time the second pass's
attention with task 9's profiler. Prints one table; results/long_context.json keeps it.

    python benchmarks/long_context.py [--ways mini-eager,vllm-eager] [--requests 32]
        [--max-prompt 512] [--max-output 256] [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cli, memory, report, results, settings  # noqa: E402
from lessons.task_13.attention import ONE_CALL  # noqa: E402  (never splits a call)

SCRIPT = "long_context"
WAYS = ("mini-one-call", "mini-gather", "mini-eager", "mini-compiled", "vllm-eager",
        "vllm-compiled")
BUDGET = 2048            # tokens a step (max_num_batched_tokens), the workload
MAX_BATCH = 16           # the lab's cap (max_num_seqs)
TIMEOUT_S = 1200


@dataclass
class Way(results.Record):
    name: str
    tokens: int
    seconds: float
    tokens_per_s: float
    attention_s: float | None        # mini_engine eager: its profiler's attention, second pass
    preemptions: int | None
    peak_pss_bytes: int = 0


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
def run_mini(args, work, way: str) -> dict:
    import torch

    from mini_engine import EngineConfig, LLMEngine, Llama, StepProfiler
    from mini_engine.engine import eos_token_ids

    torch.set_num_threads(settings.num_cores())
    model = Llama(args.model_path, args.dtype)
    model.choose_kernels((1, MAX_BATCH))
    config = EngineConfig(
        kv_bytes=settings.KV_CACHE_BYTES, page_size=settings.BLOCK_SIZE, max_batch=MAX_BATCH,
        max_model_len=args.max_prompt + args.max_output, max_num_batched_tokens=BUDGET,
        compile_model=way == "mini-compiled",
        attention_call_slots=(ONE_CALL if way == "mini-one-call"
                              else EngineConfig.attention_call_slots),
        decode_in_place=way in ("mini-eager", "mini-compiled"))
    profiled = way != "mini-compiled"      # the compiled graph runs attention inside it
    for _ in range(2):                     # the second pass is timed
        eng = LLMEngine(model, eos_token_ids(args.model_path), config,
                        profiler=StepProfiler() if profiled else None)
        eng.warm_up()
        start = time.perf_counter()
        for ids, n in work:
            eng.add_request(ids, n, min_tokens=n)
        seqs = eng.run()
        seconds = time.perf_counter() - start
    tokens = sum(len(s.output_ids) for s in seqs)
    attention = sum(s.phases.get("attention", 0.0) for s in eng.steps) if profiled else None
    return {"tokens": tokens, "seconds": seconds, "attention_s": attention,
            "preemptions": eng.scheduler.num_preemptions}


def run_vllm(args, work, way: str) -> dict:
    settings.apply_cpu_engine_env()        # before vLLM (and torch) is imported
    if way == "vllm-compiled":
        os.environ.pop("TORCHDYNAMO_DISABLE", None)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model_path, seed=settings.SEED, dtype=args.dtype,
              max_model_len=args.max_prompt + args.max_output,
              kv_cache_memory_bytes=settings.KV_CACHE_BYTES, block_size=settings.BLOCK_SIZE,
              max_num_seqs=MAX_BATCH, max_num_batched_tokens=BUDGET,
              enforce_eager=way == "vllm-eager")
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in work]
    params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n) for _, n in work]
    for _ in range(2):                     # the second pass is timed
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
    return {"tokens": sum(len(o.outputs[0].token_ids) for o in outputs), "seconds": seconds,
            "attention_s": None, "preemptions": None}


def child(args) -> None:
    from transformers import AutoConfig
    vocab = AutoConfig.from_pretrained(args.model_path).vocab_size
    work = workload(args.requests, args.max_prompt, args.max_output, vocab)
    run = run_vllm if args.child.startswith("vllm") else run_mini
    print(json.dumps(run(args, work, args.child)))


def measure(args, way: str) -> Way:
    cmd = [os.path.abspath(__file__), "--child", way, "--model-path",
           args.model_path, "--dtype", args.dtype, "--requests", str(args.requests),
           "--max-prompt", str(args.max_prompt), "--max-output", str(args.max_output)]
    # the vLLM eager child sets TORCHDYNAMO_DISABLE itself; the others must not inherit it
    found, peak = memory.run_measured(way, cmd, TIMEOUT_S, unset=("TORCHDYNAMO_DISABLE",))
    return Way(way, found["tokens"], found["seconds"], found["tokens"] / found["seconds"],
               found["attention_s"], found["preemptions"], peak)


def ways(text: str) -> list[str]:
    chosen = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WAYS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(WAYS)}, not {text!r}")
    return chosen


def main(argv: list[str] | None = None) -> LongContext:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ways", type=ways, default=list(WAYS))
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
    progress = report.progress_clock()
    for way in args.ways:
        progress(f"{way}, in a fresh process...")
        record.ways.append(measure(args, way))
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
               f"{settings.BLOCK_SIZE}; each way in a fresh process, its second pass timed")
    report.table(["way", "tokens", "s", "tok/s", "attention s", "preempted", "GB"],
                 [(w.name, w.tokens, f"{w.seconds:.1f}", f"{w.tokens_per_s:.1f}",
                   "-" if w.attention_s is None else f"{w.attention_s:.1f}",
                   "-" if w.preemptions is None else w.preemptions,
                   f"{w.peak_pss_bytes / 1e9:.2f}") for w in r.ways],
                 [15, 7, 7, 8, 12, 10, 6])
    report.note("attention s: mini_engine's profiler, eager ways; GB: the process's peak PSS")
    by = {w.name: w.tokens_per_s for w in r.ways}
    for mine, other in (("mini-eager", "vllm-eager"), ("mini-compiled", "vllm-compiled"),
                        ("mini-eager", "mini-gather"), ("mini-eager", "mini-one-call")):
        if mine in by and other in by:
            report.row(f"{mine} / {other}", f"{by[mine] / by[other]:.2f}x")


if __name__ == "__main__":
    cli.run(main)
