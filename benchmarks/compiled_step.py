"""mini_engine eager against mini_engine compiled (EngineConfig.compile_model, issue 29's first
part): what torch.compile buys a step of the engine built in task 9, on this machine.

Two copies of the model, each loaded once and its linear kernels chosen at batch 1 and the cap as
task 9 does (Llama.choose_kernels): the eager engine's, and the compiled engine's, whose graph of
the decoder layers calls those same kernels (mini_engine/compiled.py). Then, for each:
- the warm-up: seconds (the kernel choice or the compile, and a first engine), graphs made,
  the memory it added (RSS, the first engine's 128 MiB KV pool included);
- the decode step at batch 1 (one request) and at the cap (the cap's requests decoding together),
  the median of its steps, with the phases task 9's profiler times (matmuls, attention, the rest;
  in the compiled graph the matmuls and attention are custom ops that time themselves);
- tokens/s on task 9's workload (48 requests, mean output 10, seed 0, all arriving at once);
- the greedy tokens of the workload, compared request by request.
The eager engine runs first, then the compiled one, in this process, after one warm-up each.

    python benchmarks/compiled_step.py [--dtype auto|bfloat16|float32] [--requests 48]
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cli, report, settings  # noqa: E402

PHASE_TOKENS = 32     # decode steps timed at batch 1 and at the cap


def parse_args(argv):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=cli.positive_int, default=48,
                        help="requests of task 9's workload (default 48)")
    parser.add_argument("--max-batch", type=cli.positive_int, default=16,
                        help="batch cap (default 16, task 9's)")
    cli.add_model_args(parser)
    return parser.parse_args(argv)


def rss_bytes() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def build(path: str, dtype: str, compiled: bool, max_batch: int):
    """(engine factory, warm-up record) for one way of running the model."""
    from mini_engine import EngineConfig, LLMEngine, Llama, StepProfiler
    from mini_engine.engine import eos_token_ids

    model, eos = Llama(path, dtype), eos_token_ids(path)
    before, start = rss_bytes(), time.perf_counter()
    model.choose_kernels((1, max_batch))     # both: the compiled graph calls the chosen kernels

    def new(profiled: bool = False):
        eng = LLMEngine(model, eos, EngineConfig(
            kv_bytes=settings.KV_CACHE_BYTES, max_batch=max_batch,
            max_model_len=settings.MAX_MODEL_LEN, compile_model=compiled),
            profiler=StepProfiler() if profiled else None)
        return eng, eng.warm_up()
    _, warm = new()
    return new, {"seconds": time.perf_counter() - start, "graphs": warm.graphs if warm else 0,
                 "added_mb": (rss_bytes() - before) / 2**20}


def decode_steps(new, prompt_ids: list[int], batch: int) -> dict:
    """Median phases of the steps where `batch` requests all decode."""
    eng, _ = new(profiled=True)
    for _ in range(batch):
        eng.add_request(prompt_ids, PHASE_TOKENS, min_tokens=PHASE_TOKENS)
    eng.run()
    steps = [s for s in eng.steps if s.num_tokens == s.num_rows == batch]
    med = {p: statistics.median(s.phases[p] for s in steps) * 1e3
           for p in ("matmul", "attention", "forward_other", "sampling")}
    return med | {"step": statistics.median(s.seconds for s in steps) * 1e3}


def workload_run(new, workload) -> tuple[float, list[list[int]]]:
    eng, _ = new()
    start = time.perf_counter()
    for r in workload:
        eng.add_request(r.prompt_ids, r.num_output, min_tokens=r.num_output)
    seqs = eng.run()
    duration = time.perf_counter() - start
    return sum(len(s.output_ids) for s in seqs) / duration, [s.output_ids for s in seqs]


def main(argv=None) -> None:
    args = parse_args(argv)
    choice = cli.resolve_model_or_fail(args.model)
    dtype_choice = settings.resolve_dtype(args.dtype)
    dtype = dtype_choice.dtype
    os.environ.pop("TORCHDYNAMO_DISABLE", None)       # this process runs no vLLM
    import torch
    from transformers import AutoTokenizer

    from mini_engine.compiled import why_not_compiled
    from task_9_build_your_own_engine import make_workload

    if (why := why_not_compiled()) is not None:
        cli.fail(f"cannot compile here: {why}")
    torch.set_num_threads(settings.num_cores())
    tokenizer = AutoTokenizer.from_pretrained(choice.path)
    workload = make_workload(tokenizer, args.requests, 10, settings.SEED)
    report.title("mini_engine: eager against compiled (torch.compile, inductor)")
    report.run_info(choice, dtype_choice, torch.get_num_threads(), max_batch=args.max_batch,
                    kv_cache_bytes=settings.KV_CACHE_BYTES, workload=f"{args.requests} requests, "
                    f"{sum(r.num_output for r in workload)} tokens")
    found = {}
    for label, compiled in (("eager", False), ("compiled", True)):
        print(f"  {label}: warming up...", flush=True)
        new, warm = build(choice.path, dtype, compiled, args.max_batch)
        steps = {b: decode_steps(new, workload[0].prompt_ids, b) for b in (1, args.max_batch)}
        tok_s, tokens = workload_run(new, workload)
        found[label] = (warm, steps, tok_s, tokens)
    report.section("WARM-UP")
    report.table(["", "seconds", "graphs", "RSS added MB"],
                 [[label, f"{w['seconds']:.1f}", w["graphs"], f"{w['added_mb']:.0f}"]
                  for label, (w, *_rest) in found.items()], [10, 10, 8, 14])
    report.note("warm-up: loading aside, the eager engine's kernel choice or the compiled "
                "engine's compile, and a first engine with its KV pool (128 MiB)")
    report.section("A DECODE STEP (median, ms)")
    report.table(["", "batch", "step", "matmul", "attention", "rest", "sampling"],
                 [[label, b, f"{s['step']:.1f}", f"{s['matmul']:.1f}", f"{s['attention']:.1f}",
                   f"{s['forward_other']:.1f}", f"{s['sampling']:.1f}"]
                  for label, (_, steps, *_r) in found.items() for b, s in steps.items()],
                 [10, 6, 8, 8, 10, 8, 10])
    report.note("rest: the forward beyond the timed matmuls and attention: the norms, RoPE, "
                "SiLU, the adds; compiled, inductor's fused loops and the graph's own call")
    report.section("TASK 9'S WORKLOAD")
    eager, comp = found["eager"], found["compiled"]
    same = sum(a == b for a, b in zip(eager[3], comp[3]))
    report.row("tokens/s, eager", f"{eager[2]:.1f}")
    report.row("tokens/s, compiled", f"{comp[2]:.1f} ({comp[2] / eager[2]:.2f}x)")
    report.row("greedy requests identical", f"{same} of {len(workload)}")
    cap = args.max_batch
    report.row("decode step at the cap", f"{comp[1][cap]['step'] / eager[1][cap]['step']:.2f}x "
               "of eager")
    report.rule()


if __name__ == "__main__":
    cli.run(main)
