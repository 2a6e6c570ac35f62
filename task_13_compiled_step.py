"""Task 13: The step itself - what compiling the model buys, in mini_engine and in vLLM.

Tasks 9-12 rebuilt vLLM's memory manager and scheduler. This task looks inside the step: the
model's forward. A decode step reads every weight once and multiplies it by a few rows; around
those products run many small operations (RMSNorm, RoPE, SiLU, the residual adds), each dispatched
from Python, 30 layers deep. That is what a compiler fuses, and what vLLM compiles by default on
a CPU (torch.compile with inductor). The source turned it off (enforce_eager=True,
TORCHDYNAMO_DISABLE=1) to save memory on its 4 GB VM, and the lab copied it: this task measures
what that choice cost. It prints four parts:
1. What mini_engine's C kernels buy (mini_engine/kernels/) against its plain torch, and where a
   decode step goes, eager: the matmuls, attention and the rest, at batch 1 and at the cap,
   against two floors (one read of the weights; the matmuls timed alone).
2. The same engine compiled (EngineConfig.kernels "compiled", mini_engine/kernels/compiled.py):
   the same table, the compile's time, graphs and memory, tokens/s on task 9's workload, and
   whether the greedy tokens changed.
3. vLLM offline, the source's enforce_eager=True against its default compilation, each in a fresh
   process: start-up, peak memory (PSS), tokens/s at 1 request and at many, the greedy text; and
   task 9's workload against mini_engine run the same way, the two taking turns, a pass each.
4. Attention as the context grows (128 to 1,024 tokens), at batch 1 and at the cap: mini_engine's
   kernel that reads the pages in place, its torch way (contexts gathered and attended by SDPA),
   and vLLM's kernel, which reads them in place too.
   benchmarks/long_context.py measures whole runs at such contexts.

This file sets up and measures, then prints; beside it in lessons/task_13/: part 3's fresh
process (vllm_run.py), part 4's measurement (attention.py), the record and the summary's row
(record.py), the printing and the insights (report.py), the figure (figure.py).

    python task_13_compiled_step.py [--requests 48] [--mean-output 10] [--max-batch 16]
        [--vllm-requests 16] [--vllm-tokens 64] [--vllm-modes eager,compiled]
        [--contexts 128,256,512,1024] [--quick]
        [--no-vllm] [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time

import psutil

from common import cli, figures, measure, memory, results, settings
from lessons.task_13 import FIGURES, attention
from lessons.task_13.record import AttentionSweep, CompiledStep, EngineMode, Settings, VllmMode
from lessons.task_13.report import print_header, print_report
from lessons.task_9 import profile
from lessons.task_9.workloads import make_workload
from mini_engine import EngineConfig, LLMEngine, Llama, StepProfiler
from mini_engine.engine import eos_token_ids

SCRIPT = "task_13_compiled_step"
VLLM_MODES = ("eager", "compiled")
DEFAULTS = {"requests": 48, "mean_output": 10, "vllm_requests": 16, "vllm_tokens": 64,
            "vllm_modes": list(VLLM_MODES), "contexts": [128, 256, 512, 1024]}
# --quick leaves out vLLM compiled: its start alone, compiling with a cold cache, is over a minute
# on one core (docs/measurements.md), and the check --quick makes runs its code path eager
QUICK = {"requests": 8, "mean_output": 8, "vllm_requests": 4, "vllm_tokens": 16,
         "vllm_modes": ["eager"], "contexts": [128, 1024]}
PAGE_SIZE = 16
TIMED_PASSES = measure.PASSES   # of task 9's workload, each way, in turn (workload_in_turns)
VLLM_TIMEOUT_S = 600    # a compiled start is over a minute (SPEC.md); on one core, longer


def vllm_modes(text: str) -> list[str]:
    """'eager,compiled' -> the modes, each once, in VLLM_MODES' order."""
    modes = [m.strip() for m in text.split(",")]
    unknown = [m for m in modes if m not in VLLM_MODES]
    if unknown or not modes:
        raise argparse.ArgumentTypeError(f"{text!r}: give eager, compiled or both")
    return [m for m in VLLM_MODES if m in modes]


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    group.add_argument("--requests", type=cli.positive_int, default=None,
                       help=f"task 9's workload: requests (default {DEFAULTS['requests']})")
    group.add_argument("--mean-output", type=cli.positive_int, default=None,
                       help=f"their mean output length (default {DEFAULTS['mean_output']})")
    group.add_argument("--max-batch", type=cli.positive_int, default=16,
                       help="the batch cap, and the batch of part 1's step at the cap (default 16)")
    group.add_argument("--vllm-requests", type=cli.positive_int, default=None,
                       help=f"part 3: requests at once (default {DEFAULTS['vllm_requests']})")
    group.add_argument("--vllm-tokens", type=cli.positive_int, default=None,
                       help=f"part 3: tokens an answer (default {DEFAULTS['vllm_tokens']})")
    group.add_argument("--vllm-modes", type=vllm_modes, default=None,
                       help="part 3: which of eager,compiled to run (default both)")
    group.add_argument("--contexts", type=cli.int_list, default=None,
                       help="part 4: the contexts attended over, in tokens (default "
                            f"{','.join(map(str, DEFAULTS['contexts']))})")
    group.add_argument("--quick", action="store_true",
                       help="a smaller run: --requests 8 --mean-output 8 --vllm-requests 4 "
                            "--vllm-tokens 16 --vllm-modes eager --contexts 128,1024 (flags "
                            "given win); mini_engine still compiles")
    group.add_argument("--no-vllm", action="store_true", help="skip part 3 (vLLM)")
    cli.add_model_args(parser)
    args = cli.fill_unset(parser.parse_args(argv), DEFAULTS, QUICK)
    args.contexts = sorted(set(args.contexts))
    if len(args.contexts) < 2:
        parser.error("--contexts: give at least two lengths, to see attention grow")
    if args.vllm_tokens + 13 > settings.MAX_MODEL_LEN:      # the lab's prompts: at most 13 tokens
        parser.error(f"--vllm-tokens {args.vllm_tokens}: a prompt and its answer must fit "
                     f"max_model_len {settings.MAX_MODEL_LEN}")
    return args


# --- parts 1-2: mini_engine, eager then compiled ------------------------------------------------
def rss_bytes() -> int:
    return psutil.Process().memory_info().rss


def warm_up(model: Llama, eos: list[int], args, kernels: str):
    """A factory of one way's engines on the model (EngineConfig.kernels), and that way's
    warm-up cost (seconds, RSS added, graphs made): a first engine, and compiled, the compile.
    Every way runs the one model; the compiled graph calls the same C kernels as eager, so the
    compile is the only difference between those two."""
    before, start = rss_bytes(), time.perf_counter()

    def new_engine(warmed: bool = True) -> LLMEngine:
        """An engine, warmed up: the first compiles; the next ones find the process's graphs."""
        eng = LLMEngine(model, eos, EngineConfig(
            kv_bytes=settings.KV_CACHE_BYTES, page_size=PAGE_SIZE, max_batch=args.max_batch,
            max_model_len=settings.MAX_MODEL_LEN, kernels=kernels),
            profiler=StepProfiler())   # part 1's phases; what timing costs: task 9
        if warmed:
            eng.warm_up()
        return eng
    first = new_engine(warmed=False)      # kept until the RSS is read: its KV pool counts
    warm = first.warm_up()
    seconds, added = time.perf_counter() - start, rss_bytes() - before
    del first
    return new_engine, (seconds, added, warm.graphs if warm else 0)


def run_workload(new_engine, workload) -> tuple[list, list, float]:
    """Task 9's workload at once, greedy, on a fresh engine: (its steps, its requests, seconds)."""
    eng = new_engine()
    start = time.perf_counter()
    for r in workload:
        eng.add_request(r.prompt_ids, r.num_output, min_tokens=r.num_output)
    seqs = eng.run()
    return eng.steps, seqs, time.perf_counter() - start


def mini_engine_ways(path: str, dtype: str, args, progress):
    """Parts 1-2's set-up on one model: the torch way, the eager one with the C kernels, then the
    compiled one where it can be: (the model, way -> (engine factory, warm-up cost), why not
    compiled or None)."""
    from mini_engine.kernels.compiled import why_not_compiled

    progress("Part 1: mini_engine, torch and its C kernels...")
    model, eos = Llama(path, dtype), eos_token_ids(path)
    ways = {"torch": warm_up(model, eos, args, "torch"), "eager": warm_up(model, eos, args, "c")}
    why_not = why_not_compiled()
    if not why_not:
        progress("Part 2: mini_engine compiled (compiling at warm-up)...")
        ways["compiled"] = warm_up(model, eos, args, "compiled")
    return model, ways, why_not


def engine_mode(new_engine, warm, passes: list, workload) -> tuple[EngineMode, list[list[int]]]:
    """One mini_engine way's record from its median timed pass (its tokens/s, and a decode
    step's phases at the cap: task 9's part 3; at 1, a request run alone), and its tokens."""
    steps, seqs, seconds = measure.median_pass(passes, lambda p: p[2])
    tokens = [q.output_ids for q in seqs]
    num_tokens = sum(len(t) for t in tokens)
    one_request = new_engine()
    split = profile.phase_split(one_request, workload[0].prompt_ids, steps)
    chosen = one_request.products
    return EngineMode(*warm, split, num_tokens / seconds, num_tokens, seconds,
                      one_request.kernels_used(),
                      {way: [ms[b] for b in sorted(ms)] for way, ms in chosen.ms.items()}
                      if chosen else {}), tokens


def engine_modes(ways: dict, passes: dict, workload) -> tuple:
    """Each way's record from its timed passes: (torch, eager, compiled or None, requests whose
    greedy tokens eager and compiled gave alike)."""
    found = {name: engine_mode(new_engine, warm, passes[name], workload)
             for name, (new_engine, warm) in ways.items()}
    (eager, eager_tokens), (compiled, tokens) = found["eager"], found.get("compiled", (None, []))
    return found["torch"][0], eager, compiled, sum(a == b for a, b in zip(eager_tokens, tokens))


# --- part 3: vLLM, a fresh process each way, taking turns with mini_engine ---------------------
def start_vllm(path: str, dtype: str, s: Settings, mode: str, workload_file: str) -> measure.Child:
    """vLLM one way, in a fresh process (lessons/task_13/vllm_run.py), its memory sampled while
    it lives: it measures its start-up, one request and many, then runs task 9's workload each
    time it is asked."""
    return measure.Child(f"vLLM {mode}", [
        "-m", "lessons.task_13.vllm_run", "--model", path, "--dtype", dtype, "--mode", mode,
        "--requests", str(s.vllm_requests), "--tokens", str(s.vllm_tokens),
        "--max-num-seqs", str(s.max_batch), "--workload", workload_file], VLLM_TIMEOUT_S)


def mini_tokens_per_s(found_pass) -> float:
    _, seqs, seconds = found_pass
    return sum(len(q.output_ids) for q in seqs) / seconds


def workload_in_turns(path: str, dtype: str, s: Settings, args, ways: dict, workload,
                      why_not: str | None, progress) -> tuple[dict, dict | None, str | None]:
    """Task 9's workload, the ways taking turns (common/measure.py: an untimed pass, then
    TIMED_PASSES rounds): mini_engine's ways with each vLLM mode asked for, one vLLM process at a
    time (eager first), so that each ratio to vLLM comes from the same rounds; mini_engine's
    alone with --no-vllm. (each mini_engine way's timed passes, vLLM's modes (None: --no-vllm),
    why a mode did not run)."""
    mini = {name: functools.partial(run_workload, new_engine, workload)
            for name, (new_engine, _) in ways.items()}
    if args.no_vllm:
        modes, skipped = [], None
    else:
        modes = [m for m in args.vllm_modes if m in ways]      # compiled: where mini_engine is
        left_out = [m for m in VLLM_MODES if m not in args.vllm_modes]
        skipped = (f"vLLM compiles with inductor too: {why_not}"
                   if "compiled" in args.vllm_modes and why_not else
                   f"--vllm-modes left {' and '.join(left_out)} out" if left_out else None)
    if not modes:
        progress("Parts 1-2: task 9's workload, each way in turn...")
        return measure.in_turns(mini, TIMED_PASSES), (None if args.no_vllm else {}), skipped
    passes: dict[str, list] = {name: [] for name in ways}
    vllm: dict[str, VllmMode] = {}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump([[r.prompt_ids, r.num_output] for r in workload], f)
        f.flush()
        for mode in modes:
            progress(f"Part 3: vLLM {mode}, in a fresh process...")
            with start_vllm(path, dtype, s, mode, f.name) as child:
                ready = child.ready()
                progress(f"Task 9's workload, in turns with vLLM {mode}...")
                rounds = measure.in_turns({**mini, "vllm": child.run_pass}, TIMED_PASSES)
            for name in ways:
                passes[name] += rounds[name]
            vllm[mode] = VllmMode(
                **ready, peak_pss_bytes=child.peak_bytes,
                workload_tokens_per_s=statistics.median(p["tokens"] / p["seconds"]
                                                        for p in rounds["vllm"]),
                mini_tokens_per_s=statistics.median(mini_tokens_per_s(p) for p in rounds[mode]))
    return passes, vllm, skipped


# --- part 4: attention as the context grows ---------------------------------------------------
def vllm_attention(path: str, dtype: str, s: Settings,
                   contexts: list[int]) -> dict[int, list[float]]:
    """Part 4's vLLM side: its attention kernel at each context, in a process of its own (part
    3's processes measure vLLM's memory, which this one's pools would swell)."""
    found, _ = measure.run_once("vLLM's attention", [
        "-m", "lessons.task_13.attention", "--model", path, "--dtype", dtype,
        "--batches", ",".join(map(str, sorted({1, s.max_batch}))),
        "--contexts", ",".join(map(str, contexts))],
        VLLM_TIMEOUT_S)
    return {int(batch): ms for batch, ms in found.items()}


def attention_sweep(path: str, dtype: str, s: Settings, args, progress) -> AttentionSweep:
    """mini_engine's side on a fresh model, last, so that its pools (hundreds of MB at the cap)
    come and go after the timed workloads; then vLLM's, in a process of its own."""
    progress("Part 4: mini_engine's attention at longer contexts...")
    sweep = AttentionSweep(args.contexts, *attention.mini_engine_sweep(
        Llama(path, dtype), sorted({1, args.max_batch}), args.contexts))
    memory.give_memory_back()
    if not args.no_vllm:
        progress("Part 4: vLLM's attention, in its own process...")
        sweep.vllm_ms = vllm_attention(path, dtype, s, args.contexts)
    return sweep


def main(argv: list[str] | None = None) -> CompiledStep:
    args = parse_args(argv)
    model_choice = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    # this process runs no vLLM (part 3 runs it in processes of their own), so torch.compile
    # stays on here whatever the shell or the lab set for vLLM
    os.environ.pop("TORCHDYNAMO_DISABLE", None)
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(settings.num_cores())
    s = Settings(args.requests, args.mean_output, args.max_batch, settings.KV_CACHE_BYTES,
                 PAGE_SIZE, args.vllm_requests, args.vllm_tokens)
    print_header(model_choice, dtype, torch.get_num_threads(), s)
    tokenizer = AutoTokenizer.from_pretrained(model_choice.path)
    workload = make_workload(tokenizer, args.requests, args.mean_output, settings.SEED)
    progress = measure.progress_clock()

    path, dt = model_choice.path, dtype.dtype
    model, ways, why_not = mini_engine_ways(path, dt, args, progress)
    passes, vllm, vllm_skipped = workload_in_turns(path, dt, s, args, ways, workload, why_not,
                                                   progress)
    torch_way, eager, compiled, num_identical = engine_modes(ways, passes, workload)
    record = CompiledStep(s, profile.machine_bounds(model, dt, list(eager.phases)), eager,
                          compiled, why_not, num_identical, len(workload), vllm, vllm_skipped,
                          header=results.RunHeader.of(model_choice, dtype,
                                                      torch.get_num_threads()),
                          torch=torch_way)
    del model, ways
    memory.give_memory_back()
    record.attention = attention_sweep(path, dt, s, args, progress)
    progress("done")

    print_report(record)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
