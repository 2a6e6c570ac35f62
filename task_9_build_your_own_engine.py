"""Task 9: Build the engine yourself - PagedAttention and continuous batching from scratch.

The source's title promises to reproduce PagedAttention and continuous batching yourself; this
task does, with mini_engine/ (plain torch, one file per concept: read mini_engine/__init__.py).
It prints four parts:

1. Correct: prompts of different lengths run together, greedy, fp32; the engine's tokens
   against transformers' generate(do_sample=False), token for token.
2. Static vs continuous batching on a mixed-length workload (seeded; output lengths drawn from
   an exponential distribution, EOS held off so each request makes exactly its length): same
   engine, same batch cap. Static runs twice, with finished rows kept as padding (transformers'
   generate) and dropped, so the gain splits into padding removed and idle slots refilled. The
   policies and part 4's vLLM take turns (common/measure.py: an untimed round, then --passes):
   each keeps its median pass, each ratio the median of its rounds and their range.
3. Where the step time goes: the engine's phases at batch 1 and at the cap, beside the model's
   matmuls timed alone (the kernel floor) and one read of the weights at the memory bandwidth,
   and the kernel each kind of linear layer chose when the model loaded
   (lessons/task_9/profile.py).
4. Against the real thing: the same workload through vLLM's LLM.generate in this process (the
   lab's settings, the same cap) and transformers' generate in static padded batches (one pass).

Here: setting up and measuring parts 1, 2 and 4. The workload: lessons/task_9/workloads.py; the
run's record: lessons/task_9/record.py; its report: lessons/task_9/report.py; its figures:
lessons/task_9/figure.py.

    python task_9_build_your_own_engine.py [--requests 48] [--max-batch 16] [--mean-output 10]
        [--seed 0] [--page-size 16] [--kv-bytes 134217728] [--policy both] [--passes 3]
        [--no-vllm] [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import functools
import statistics
import time

from common import cli, engine, figures, kv, load, measure, memory, own_engines, results, settings
from common.shape import ModelShape, torch_dtype
from lessons.task_9 import FIGURES, profile, record
from lessons.task_9.record import (Correctness, HFRun, Mismatch, OwnEngine, PolicyRun,
                                   RunSettings, VllmRun, VllmSettings)
from lessons.task_9.report import print_header, print_report
from lessons.task_9.workloads import Request, make_workload
from mini_engine import EngineConfig, LLMEngine, Llama, StepProfiler

SCRIPT = "task_9_build_your_own_engine"
# Part 1: prompts of different lengths (3 to 30 tokens), each generating CHECK_TOKENS greedily.
CHECK_PROMPTS = [
    "Hi", "The capital of France is", settings.PROMPT, *load.user_prompts(3),
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three reasons why the sky looks blue during the day and red at sunset, in one "
    "short paragraph that a ten year old child could follow:",
]
CHECK_TOKENS = 16


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    # 48 requests of mean 10 (seed 0 draws 550 tokens, 1-41 each): three static batches of 16
    group.add_argument("--requests", type=cli.positive_int, default=48,
                       help="requests in the workload, all arriving at once (default 48)")
    group.add_argument("--mean-output", type=cli.positive_int, default=10,
                       help="mean of the exponential output lengths, tokens (default 10)")
    group.add_argument("--seed", type=int, default=settings.SEED,
                       help=f"seed of the output lengths and of sampling (default {settings.SEED})")
    group = parser.add_argument_group("engine")
    group.add_argument("--max-batch", type=cli.positive_int, default=16,
                       help="batch cap: requests computed in one step (default 16)")
    group.add_argument("--page-size", type=cli.positive_int, default=16,
                       help="tokens per KV block (default 16, task 4's block); must divide "
                            f"max_model_len ({settings.MAX_MODEL_LEN})")
    group.add_argument("--kv-bytes", type=cli.positive_int, default=settings.KV_CACHE_BYTES,
                       help=f"KV-cache budget in bytes (default {settings.KV_CACHE_BYTES:,}, the "
                            "lab's 128 MiB)")
    group.add_argument("--policy", choices=("both", "continuous", "static"), default="both",
                       help="which batching to run (default both, compared)")
    group.add_argument("--no-vllm", action="store_true",
                       help="skip part 4 (vLLM and transformers on the same workload)")
    group.add_argument("--passes", type=cli.positive_int, default=measure.PASSES,
                       help="timed passes of each policy and of vLLM, taking turns after an "
                            f"untimed round (default {measure.PASSES})")
    cli.add_kernels_arg(parser)
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    if settings.MAX_MODEL_LEN % args.page_size:
        parser.error(f"--page-size {args.page_size} does not divide max_model_len "
                     f"{settings.MAX_MODEL_LEN}: a full request would end in a part block")
    return args


# --- set up: the budget, the models, the workload, an engine --------------------------------
def check_budget(args, model_path: str, dtype: str) -> None:
    """--kv-bytes must hold one request of max_model_len in whole blocks (fp32 for part 1, the
    lab's dtype for the rest), else one line and exit 2."""
    model_shape = ModelShape.from_folder(model_path)
    for name in ("float32", dtype):
        need = (kv.cdiv(settings.MAX_MODEL_LEN, args.page_size) * args.page_size
                * model_shape.kv_bytes_per_token(name))
        if args.kv_bytes < need:
            cli.fail(f"--kv-bytes {args.kv_bytes:,} cannot hold one request of "
                     f"{settings.MAX_MODEL_LEN} tokens ({need:,} B in {name})")


def load_models(model_path: str, dtype: str) -> tuple[Llama, object]:
    """The engine's model and transformers' in this dtype."""
    from transformers import AutoModelForCausalLM

    model = Llama(model_path, dtype)
    return (model,
            AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype)).eval())


def new_engine(model: Llama, eos_ids, args, policy: str, pad_finished: bool = True) -> LLMEngine:
    # profiled: part 3 reads the phases of these runs' steps (timing costs ~26 us a step)
    return LLMEngine(model, eos_ids, EngineConfig(
        kv_bytes=args.kv_bytes, page_size=args.page_size, max_batch=args.max_batch,
        max_model_len=settings.MAX_MODEL_LEN, policy=policy, pad_finished=pad_finished,
        seed=args.seed, kernels=args.kernels), profiler=StepProfiler())


# --- part 1: correct -------------------------------------------------------------------------
def check_correctness(model: Llama, eos_ids, hf_model, tokenizer, args) -> Correctness:
    """All prompts through the engine at once, each through transformers alone; greedy."""
    import torch

    prompts = [tokenizer(p)["input_ids"] for p in CHECK_PROMPTS]
    eng = new_engine(model, eos_ids, args, "continuous")
    seqs = [eng.add_request(ids, CHECK_TOKENS, min_tokens=CHECK_TOKENS) for ids in prompts]
    eng.run()
    mismatches = []
    for i, (ids, seq) in enumerate(zip(prompts, seqs)):
        with torch.inference_mode():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=CHECK_TOKENS,
                                    min_new_tokens=CHECK_TOKENS, do_sample=False,
                                    pad_token_id=tokenizer.eos_token_id, output_logits=True,
                                    return_dict_in_generate=True)
        reference = out.sequences[0, len(ids):].tolist()
        if reference != seq.output_ids:
            pos = next(p for p, (a, b) in enumerate(zip(reference, seq.output_ids)) if a != b)
            top2 = out.logits[pos][0].float().topk(2).values.tolist()
            mismatches.append(Mismatch(i, pos, seq.output_ids[pos], reference[pos],
                                       top2[0] - top2[1]))
    return Correctness(len(prompts), [len(p) for p in prompts], CHECK_TOKENS,
                       len(prompts) - len(mismatches), mismatches, len(eng.steps))


# --- part 2: static vs continuous ------------------------------------------------------------
def run_policy(model: Llama, eos_ids, workload: list[Request], args, label: str, policy: str,
               pad_finished: bool = True) -> tuple[PolicyRun, list]:
    """The whole workload, all arriving at once, through a fresh engine under this policy: its
    figures and its steps (the engine, its KV pool with it, is dropped)."""
    eng = new_engine(model, eos_ids, args, policy, pad_finished)
    start = time.perf_counter()
    for r in workload:
        eng.add_request(r.prompt_ids, r.num_output, min_tokens=r.num_output,
                        temperature=settings.TEMPERATURE)
    seqs = eng.run()
    duration_s = time.perf_counter() - start
    num_tokens = sum(len(s.output_ids) for s in seqs)
    pages_per_request = kv.cdiv(settings.MAX_MODEL_LEN, args.page_size)
    return PolicyRun(
        label, num_tokens / duration_s, duration_s, num_tokens,
        mean_latency_s=statistics.mean(s.latency_s for s in seqs),
        p95_latency_s=load.percentile([s.latency_s for s in seqs], 95),
        mean_ttft_s=statistics.mean(s.ttft_s for s in seqs), num_steps=len(eng.steps),
        slot_utilization_fraction=num_tokens / (args.max_batch * len(eng.steps)),
        peak_num_pages=max(st.num_pages_used for st in eng.steps),
        contiguous_num_pages=max(st.num_rows for st in eng.steps) * pages_per_request,
        num_preemptions=eng.scheduler.num_preemptions), eng.steps


def policy_ways(model: Llama, eos_ids, workload: list[Request], args) -> dict:
    """label -> a pass of the workload under that batching policy, each policy asked for."""
    plans = {"static": [("static", "static", True), ("static no-pad", "static", False)],
             "continuous": [("continuous", "continuous", True)]}
    return {label: functools.partial(run_policy, model, eos_ids, workload, args, label, policy,
                                     pad)
            for k, v in plans.items() if args.policy in (k, "both") for label, policy, pad in v}


def in_turns(ways: dict, vllm_pass, passes: int, progress) -> tuple[dict, dict, list]:
    """Parts 2 and 4 taking turns: each policy, then vLLM (where it runs), a pass each round,
    after an untimed round. (label -> the median pass's PolicyRun, label -> its steps, vLLM's
    timed passes: (seconds, tokens) each)."""
    def on_pass(name: str, round_: int) -> None:    # one line, as the rounds start
        if name == next(iter(ways)) and round_ == 0:
            progress(f"Parts 2 and 4: an untimed round, then {passes} in turns...")
    found = measure.in_turns({**ways, **({"vLLM": vllm_pass} if vllm_pass else {})}, passes,
                             on_pass)
    medians = {label: record.median_pass(found[label]) for label in ways}
    return ({label: run for label, (run, _) in medians.items()},
            {label: steps for label, (_, steps) in medians.items()}, found.get("vLLM", []))


# --- part 3, where the step time goes: lessons/task_9/profile.py ------------------------------
# --- part 4: the real thing ------------------------------------------------------------------
def run_hf_static(hf_model, tokenizer, workload: list[Request], args, progress) -> HFRun:
    """transformers' generate in static batches of --max-batch, left-padded; every row runs to
    the batch's longest output, only each request's own tokens count."""
    import torch

    progress("Part 4: transformers' generate, static batches...")
    tokenizer.padding_side = "left"
    start = time.perf_counter()
    for i in range(0, len(workload), args.max_batch):
        batch = workload[i:i + args.max_batch]
        longest = max(r.num_output for r in batch)
        inputs = tokenizer.pad({"input_ids": [r.prompt_ids for r in batch]}, return_tensors="pt")
        with torch.inference_mode():
            hf_model.generate(**inputs, max_new_tokens=longest, min_new_tokens=longest,
                              do_sample=True, temperature=settings.TEMPERATURE,
                              pad_token_id=tokenizer.eos_token_id)
    duration_s = time.perf_counter() - start
    num_tokens = sum(r.num_output for r in workload)
    return HFRun(duration_s, num_tokens, num_tokens / duration_s)


def start_vllm(model_path: str, dtype: str, workload: list[Request], args, progress):
    """vllm.LLM in this process, with the lab's settings and the same batch cap: (the engine, a
    pass of the workload through it: (seconds, tokens made)); (None, None) with --no-vllm. Its
    warm-up is the turns' untimed round."""
    if args.no_vllm:
        return None, None
    progress("Part 4: starting vLLM in this process...")
    eng = engine.start_engine(model_path, dtype, max_num_seqs=args.max_batch)   # sets its env
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in workload]
    params = [SamplingParams(temperature=settings.TEMPERATURE, max_tokens=r.num_output,
                             min_tokens=r.num_output) for r in workload]

    def one_pass() -> tuple[float, int]:
        start = time.perf_counter()
        outputs = eng.llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)
    return eng, one_pass


def vllm_run(eng, passes: list[tuple[float, int]], num_threads: int) -> VllmRun:
    """vLLM's record from its timed passes, and how it ran."""
    capacity = engine.engine_capacity(eng)
    return VllmRun.of(passes, num_threads, VllmSettings(**eng.settings), capacity.block_size,
                      capacity.num_blocks)


def main(argv: list[str] | None = None) -> OwnEngine:
    args = parse_args(argv)
    model_choice, dtype, tokenizer, eos_ids, progress, header = own_engines.start(args)
    check_budget(args, model_choice.path, dtype.dtype)
    print_header(model_choice, dtype, header.threads, RunSettings.of(args))

    progress("Part 1: the engine against transformers, greedy...")
    model, hf_model = load_models(model_choice.path, "float32")
    correct = check_correctness(model, eos_ids, hf_model, tokenizer, args)
    if dtype.dtype != "float32":   # parts 2-4 run the lab's dtype
        model, hf_model = load_models(model_choice.path, dtype.dtype)
    workload = make_workload(tokenizer, args.requests, args.mean_output, args.seed)
    hf_run = None if args.no_vllm else run_hf_static(hf_model, tokenizer, workload, args, progress)
    del hf_model                   # vLLM's engine, beside ours, needs the memory it holds
    memory.give_memory_back()
    vllm, vllm_pass = start_vllm(model_choice.path, dtype.dtype, workload, args, progress)
    runs, steps_of, vllm_passes = in_turns(policy_ways(model, eos_ids, workload, args),
                                           vllm_pass, args.passes, progress)
    best = runs.get("continuous") or runs["static"]
    progress("Part 3: timing the phases of a step...")
    one_request = new_engine(model, eos_ids, args, "continuous")
    split = profile.phase_split(one_request, workload[0].prompt_ids, steps_of[best.label])
    run = OwnEngine(
        header=header,
        settings=RunSettings.of(args), correctness=correct,
        workload_num_output_tokens=[r.num_output for r in workload], policies=runs,
        timelines={label: record.timeline_record(steps) for label, steps in steps_of.items()},
        phases=split, machine=profile.machine_bounds(model, dtype.dtype, list(split)),
        kernels=one_request.kernels_used(), transformers_static=hf_run,
        vllm=vllm_run(vllm, vllm_passes, header.threads) if vllm else None,
        num_kv_blocks=one_request.block_manager.num_pages)
    progress("done")
    run.continuous_over_static_spread, run.engine_over_vllm_spread = record.ratios(runs, run.vllm)

    print_report(run)
    figures.saved(results.save(SCRIPT, run), run, FIGURES)
    return run


if __name__ == "__main__":
    cli.run(main)
