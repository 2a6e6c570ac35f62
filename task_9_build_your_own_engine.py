"""Task 9: Build the engine yourself - PagedAttention and continuous batching from scratch.

The source's title promises to reproduce PagedAttention and continuous batching yourself; this
task does, with mini_engine/ (plain torch, one file per concept: read mini_engine/__init__.py).
It prints four parts:

1. Correct: prompts of different lengths run together, greedy, fp32; the engine's tokens
   against transformers' generate(do_sample=False), token for token.
2. Static vs continuous batching on a mixed-length workload (seeded; output lengths drawn from
   an exponential distribution, EOS held off so each request makes exactly its length): same
   engine, same batch cap. Static runs twice, with finished rows kept as padding (transformers'
   generate) and dropped, so the gain splits into padding removed and idle slots refilled.
3. Where the step time goes: the engine's phases at batch 1 and at the cap, beside the model's
   matmuls timed alone (the kernel floor) and one read of the weights at the memory bandwidth,
   and the kernel each kind of linear layer chose when the model loaded.
4. Against the real thing: the same workload through vLLM's LLM.generate (the lab's settings,
   the same batch cap) and transformers' generate in static padded batches. The engine's model
   and transformers' are freed first: vLLM's engine needs the memory.

    python task_9_build_your_own_engine.py [--requests 48] [--max-batch 16] [--mean-output 10]
        [--seed 0] [--page-size 16] [--kv-bytes 134217728] [--policy both] [--no-vllm]
        [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import gc
import random
import statistics
import time
from dataclasses import asdict, dataclass

from common import cli, engine, figures, kv, load, report, results, settings
from common.shape import ModelShape, torch_dtype
from common import roofline as rl
from mini_engine import LLMEngine, Llama
from mini_engine.engine import PHASES, eos_token_ids

SCRIPT = "task_9_build_your_own_engine"
# Part 1: prompts of different lengths (3 to 30 tokens), each generating CHECK_TOKENS greedily.
CHECK_PROMPTS = [
    "Hi", "The capital of France is", settings.PROMPT, *load.user_prompts(3),
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "List three reasons why the sky looks blue during the day and red at sunset, in one "
    "short paragraph that a ten year old child could follow:",
]
CHECK_TOKENS = 16
PHASE_TOKENS = 24    # part 3: the batch-1 run whose decode steps are timed
PHASE_LABELS = {"matmul": "matmuls (linear layers)", "attention": "attention (paged)",
                "forward_other": "rest of the forward", "sampling": "sampling",
                "scheduling": "scheduling"}


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    # 48 requests of mean 10 (seed 0 draws 550 tokens, 1-41 each): three static batches of 16,
    # part 2 in about 35 s on 2 AVX2 cores (32 of mean 24 drew 991 tokens and took 57 s)
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
                       help="tokens per KV page (default 16, task 4's page); must divide "
                            f"max_model_len ({settings.MAX_MODEL_LEN})")
    group.add_argument("--kv-bytes", type=cli.positive_int, default=settings.KV_CACHE_BYTES,
                       help=f"KV-cache budget in bytes (default {settings.KV_CACHE_BYTES:,}, the "
                            "lab's 128 MiB)")
    group.add_argument("--policy", choices=("both", "continuous", "static"), default="both",
                       help="which batching to run (default both, compared)")
    group.add_argument("--no-vllm", action="store_true",
                       help="skip part 4 (vLLM and transformers on the same workload)")
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    if settings.MAX_MODEL_LEN % args.page_size:
        parser.error(f"--page-size {args.page_size} does not divide max_model_len "
                     f"{settings.MAX_MODEL_LEN}: a full request would end in a part page")
    return args


# --- the workload ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    num_output: int


def make_workload(tokenizer, num_requests: int, mean_output: int, seed: int,
                  max_model_len: int = settings.MAX_MODEL_LEN) -> list[Request]:
    """The lab's user prompts; output lengths drawn from an exponential distribution (the shape
    of Anyscale's continuous-batching benchmark), at least 1, capped so prompt + output fit."""
    rng = random.Random(seed)
    workload = []
    for prompt in load.user_prompts(num_requests):
        ids = tokenizer(prompt)["input_ids"]
        drawn = max(1, round(rng.expovariate(1 / mean_output)))
        workload.append(Request(ids, min(drawn, max_model_len - len(ids))))
    return workload


def new_engine(model: Llama, eos_ids, args, policy: str, pad_finished: bool = True) -> LLMEngine:
    return LLMEngine(model, eos_ids, args.kv_bytes, args.page_size, args.max_batch,
                     settings.MAX_MODEL_LEN, policy, pad_finished, seed=args.seed)


# --- part 1: correct -------------------------------------------------------------------------
def check_correctness(model: Llama, eos_ids, hf_model, tokenizer, args) -> dict:
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
            mismatches.append({"request": i, "position": pos, "engine": seq.output_ids[pos],
                               "transformers": reference[pos], "top2_margin": top2[0] - top2[1]})
    return {"num_prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
            "new_tokens": CHECK_TOKENS, "num_identical": len(prompts) - len(mismatches),
            "mismatches": mismatches, "steps": len(eng.steps)}


# --- part 2: static vs continuous ------------------------------------------------------------
@dataclass
class PolicyRun:
    label: str
    tokens_per_s: float
    seconds: float
    num_tokens: int
    mean_latency_s: float
    p95_latency_s: float
    mean_ttft_s: float
    num_steps: int
    slot_utilization: float    # generated tokens / (batch slots x steps)
    peak_pages: int            # pages in use at the peak
    contiguous_pages: int      # what reserving max_model_len per running request would hold
    num_preemptions: int


def run_policy(model: Llama, eos_ids, workload: list[Request], args, label: str, policy: str,
               pad_finished: bool = True) -> tuple[PolicyRun, LLMEngine]:
    eng = new_engine(model, eos_ids, args, policy, pad_finished)
    start = time.perf_counter()
    for r in workload:
        eng.add_request(r.prompt_ids, r.num_output, min_tokens=r.num_output,
                        temperature=settings.TEMPERATURE)
    seqs = eng.run()
    seconds = time.perf_counter() - start
    num_tokens = sum(len(s.output_ids) for s in seqs)
    pages_per_request = kv.cdiv(settings.MAX_MODEL_LEN, args.page_size)
    return PolicyRun(
        label, num_tokens / seconds, seconds, num_tokens,
        statistics.mean(s.latency_s for s in seqs),
        load.percentile([s.latency_s for s in seqs], 95),
        statistics.mean(s.ttft_s for s in seqs), len(eng.steps),
        num_tokens / (args.max_batch * len(eng.steps)),
        max(st.num_pages_used for st in eng.steps),
        max(st.num_rows for st in eng.steps) * pages_per_request,
        eng.scheduler.num_preemptions), eng


# --- part 4: the real thing ------------------------------------------------------------------
def run_hf_static(hf_model, tokenizer, workload: list[Request], max_batch: int) -> dict:
    """transformers' generate in static batches of max_batch, left-padded; every row runs to the
    batch's longest output, only each request's own tokens count."""
    import torch

    tokenizer.padding_side = "left"
    start = time.perf_counter()
    for i in range(0, len(workload), max_batch):
        batch = workload[i:i + max_batch]
        longest = max(r.num_output for r in batch)
        inputs = tokenizer.pad({"input_ids": [r.prompt_ids for r in batch]}, return_tensors="pt")
        with torch.inference_mode():
            hf_model.generate(**inputs, max_new_tokens=longest, min_new_tokens=longest,
                              do_sample=True, temperature=settings.TEMPERATURE,
                              pad_token_id=tokenizer.eos_token_id)
    seconds = time.perf_counter() - start
    num_tokens = sum(r.num_output for r in workload)
    return {"seconds": seconds, "num_tokens": num_tokens, "tokens_per_s": num_tokens / seconds}


def run_vllm(model_path: str, dtype: str, workload: list[Request], max_batch: int) -> dict:
    """vllm.LLM with the lab's settings and the same batch cap; one untimed warm-up."""
    import torch

    eng = engine.start_engine(model_path, dtype, max_num_seqs=max_batch)   # sets vLLM's env first
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    eng.llm.generate([TokensPrompt(prompt_token_ids=workload[0].prompt_ids)],
                     SamplingParams(max_tokens=4), use_tqdm=False)
    prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in workload]
    params = [SamplingParams(temperature=settings.TEMPERATURE, max_tokens=r.num_output,
                             min_tokens=r.num_output) for r in workload]
    start = time.perf_counter()
    outputs = eng.llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    capacity = engine.engine_capacity(eng)
    return {"seconds": seconds, "num_tokens": num_tokens, "tokens_per_s": num_tokens / seconds,
            "threads": torch.get_num_threads(), "settings": eng.settings,
            "block_size": capacity.block_size, "num_blocks": capacity.num_blocks}


# --- part 3: where the step time goes --------------------------------------------------------
def mean_phases(steps) -> dict:
    """Mean seconds per phase (and per step) over these steps."""
    return {**{p: statistics.mean(s.phases[p] for s in steps) for p in PHASES},
            "step": statistics.mean(s.seconds for s in steps), "num_steps": len(steps)}


def phase_split(model: Llama, eos_ids, workload: list[Request], cont_engine: LLMEngine,
                args) -> dict:
    """Decode steps only (one new token per row): batch 1 from a one-request run, the cap from
    the continuous run's full steps (the fullest it had, if it never filled the cap)."""
    eng = new_engine(model, eos_ids, args, "continuous")
    num_tokens = min(PHASE_TOKENS, settings.MAX_MODEL_LEN - len(workload[0].prompt_ids))
    eng.add_request(workload[0].prompt_ids, num_tokens, min_tokens=num_tokens)
    eng.run()
    decode = [s for s in cont_engine.steps if s.num_tokens == s.num_rows]
    fullest = max(s.num_rows for s in decode)
    return {"1": mean_phases(eng.steps[1:]),
            str(fullest): mean_phases([s for s in decode if s.num_rows == fullest])}


def machine_figures(model: Llama, dtype: str, batches: list[int]) -> dict:
    """Bandwidth (results/machine.json when saved, else measured now) and the kernel floor of
    the model's own weight shapes at these batch sizes (saved, or measured now: a few seconds),
    through the lab's one loader of the machine's figures (common.roofline)."""
    found = rl.machine_figures(model.config, dtype, batches, settings.num_cores(),
                               measure_floor=True)
    bandwidth = found.machine.bandwidth_bytes_s
    weight_bytes = rl.model_cost(model.config, dtype).weight_bytes
    return {"bandwidth_bytes_s": bandwidth, "weight_bytes": weight_bytes,
            "weight_read_s": weight_bytes / bandwidth,
            "bandwidth_from": ("measured now" if found.source.startswith("measured now")
                               else "results/machine.json"),
            "kernel_floor_s": {str(b): found.floor.step_s[b] for b in batches}}


# --- the report ------------------------------------------------------------------------------
def print_correctness(c: dict) -> None:
    report.section(f"1. CORRECT: {c['num_prompts']} prompts vs transformers (greedy, fp32)")
    report.row("Prompt lengths (tokens)", ", ".join(map(str, c["prompt_tokens"])))
    report.row("New tokens each", f"{c['new_tokens']} (EOS held off, as min_new_tokens)")
    report.row("Identical to transformers", f"{c['num_identical']}/{c['num_prompts']} "
                                            f"(every token, in {c['steps']} engine steps)")
    for m in c["mismatches"]:
        report.note(f"DIFFERS: request {m['request']} at new token {m['position']}: engine "
                    f"{m['engine']}, transformers {m['transformers']}; top-2 logit margin "
                    f"there {m['top2_margin']:.2e}", indent=2)


def print_policies(runs: list[PolicyRun], args, workload: list[Request]) -> None:
    lengths = [r.num_output for r in workload]
    report.section(f"2. STATIC vs CONTINUOUS BATCHING ({len(workload)} requests)")
    report.row("Output lengths (tokens)", f"mean {statistics.mean(lengths):.1f}, min "
               f"{min(lengths)}, max {max(lengths)} (exponential, seed {args.seed})")
    report.row("Batch cap, page size", f"{args.max_batch} requests, {args.page_size} tokens")
    headers = ["", *[r.label for r in runs]]
    widths = [23] + [42 // len(runs)] * len(runs)
    rows = [("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
            ("Time (s)", *(f"{r.seconds:.1f}" for r in runs)),
            ("Latency mean (s)", *(f"{r.mean_latency_s:.2f}" for r in runs)),
            ("Latency p95 (s)", *(f"{r.p95_latency_s:.2f}" for r in runs)),
            ("TTFT mean (s)", *(f"{r.mean_ttft_s:.2f}" for r in runs)),
            ("Steps", *(r.num_steps for r in runs)),
            ("Slot utilisation", *(f"{100 * r.slot_utilization:.0f}%" for r in runs)),
            ("Peak pages in use", *(r.peak_pages for r in runs)),
            ("  if contiguous", *(r.contiguous_pages for r in runs)),
            ("Preemptions", *(r.num_preemptions for r in runs))]
    report.table(headers, rows, widths)
    report.note(f"Slot utilisation = generated tokens / ({args.max_batch} slots x steps); "
                f"contiguous = rows x {kv.cdiv(settings.MAX_MODEL_LEN, args.page_size)} pages "
                f"({settings.MAX_MODEL_LEN} tokens)")


def print_real_thing(ours: PolicyRun, vllm: dict | None, hf: dict | None, args) -> None:
    report.section("4. AGAINST THE REAL THING (same workload, same cap)")
    rows = [(f"mini_engine, {ours.label}", f"{ours.tokens_per_s:.1f}", f"{ours.seconds:.1f}")]
    if vllm:
        rows.append(("vLLM LLM.generate", f"{vllm['tokens_per_s']:.1f}", f"{vllm['seconds']:.1f}"))
    if hf:
        rows.append(("transformers, static", f"{hf['tokens_per_s']:.1f}", f"{hf['seconds']:.1f}"))
    report.table(["Engine", "Tokens/s", "Time (s)"], rows, widths=[30, 17, 18])
    if vllm:
        report.row("This engine / vLLM", f"{ours.tokens_per_s / vllm['tokens_per_s']:.2f}x")
        report.row("vLLM ran", f"block size {vllm['block_size']}, {vllm['num_blocks']} blocks, "
                               f"max_num_seqs {args.max_batch}, {vllm['threads']} threads")


def print_phases(split: dict, machine: dict) -> None:
    report.section("3. WHERE THE STEP TIME GOES (decode steps, ms)")
    batches = list(split)
    report.table(["Phase", *(f"batch {b}" for b in batches)],
                 [*((PHASE_LABELS[p], *(f"{1000 * split[b][p]:.1f}" for b in batches))
                    for p in PHASES),
                  ("whole step", *(f"{1000 * split[b]['step']:.1f}" for b in batches)),
                  ("kernel floor (matmuls alone)",
                   *(f"{1000 * machine['kernel_floor_s'][b]:.1f}" for b in batches)),
                  ("one read of the weights",
                   *(f"{1000 * machine['weight_read_s']:.1f}" for _ in batches))],
                 widths=[33, 16, 16])
    report.note(f"Weights {machine['weight_bytes'] / 1e6:,.0f} MB at "
                f"{machine['bandwidth_bytes_s'] / 1e9:.1f} GB/s ({machine['bandwidth_from']}); "
                "kernel floor: q, k, v, o, gate, up, down and the LM head timed alone "
                "through F.linear, unfused")


def linear_choices(model: Llama) -> dict:
    """What the model measured at load to choose its linear layers' kernels (for the report)."""
    return {"batch_sizes": list(model.linear_batch_sizes), "seconds": model.linear_choice_s,
            "layers": {kind: {"chosen": c.chosen, "ms": {k: 1000 * v for k, v in c.seconds.items()}}
                       for kind, c in model.linear_choices.items()}}


def print_linear_choices(choices: dict) -> None:
    """The kernel each kind of linear layer runs, and what the others measured (fused)."""
    layers = choices["layers"]
    kernels = [k for k in next(iter(layers.values()))["ms"] if ", unfused" not in k]
    sizes = " + ".join(map(str, choices["batch_sizes"]))
    report.note(f"Linear layers: kernel measured at load, ms for all layers of a kind at "
                f"batch {sizes} ({choices['seconds']:.1f} s in all):")
    widths = [9] + [(65 - 9 - 17) // len(kernels)] * len(kernels) + [17]
    report.table(["Layer", *kernels, "chosen"],
                 [(kind, *(f"{c['ms'][k]:.1f}" for k in kernels), c["chosen"])
                  for kind, c in layers.items()], widths)
    fusion = []
    for kind, parts in (("qkv", "q, k, v"), ("gate_up", "gate, up")):
        ms = layers[kind]["ms"]
        fused = min(v for k, v in ms.items() if ", unfused" not in k)
        apart = min(v for k, v in ms.items() if ", unfused" in k)
        fusion.append(f"{parts} {'fused' if fused <= apart else 'apart'} "
                      f"({fused:.1f} fused vs {apart:.1f} ms apart)")
    report.note("Best of each: " + "; ".join(fusion))


def insights(correct: dict, runs: dict, ours: PolicyRun, vllm: dict | None, split: dict,
             machine: dict, choices: dict) -> list[str]:
    """Each line chosen from what this run measured."""
    lines = []
    n, ok = correct["num_prompts"], correct["num_identical"]
    lines.append(f"Paged KV cache + batching from scratch: {ok}/{n} prompts token-identical to "
                 "transformers" + ("" if ok == n else " - the differing ones are listed above "
                                   "with their logit margin"))
    if "static" in runs and "continuous" in runs:
        static, cont = runs["static"], runs["continuous"]
        ratio = cont.tokens_per_s / static.tokens_per_s
        idle = 100 * (1 - static.slot_utilization)
        verb = "made" if ratio >= 1 else "made only"
        lines.append(f"Continuous batching {verb} {ratio:.2f}x static's tokens/s: static kept "
                     f"{idle:.0f}% of its slot-steps idle or padding, continuous "
                     f"{100 * (1 - cont.slot_utilization):.0f}%")
        if "static no-pad" in runs:
            nopad = runs["static no-pad"]
            lines.append(f"Of that, {nopad.tokens_per_s / static.tokens_per_s:.2f}x came from not "
                         f"computing finished rows and {cont.tokens_per_s / nopad.tokens_per_s:.2f}x "
                         "from refilling their slots at the next step")
    lines.append(f"Paging held at most {ours.peak_pages} pages where reserving max_model_len "
                 f"per running request would have held {ours.contiguous_pages}")
    if vllm:
        lines.append(f"This engine ran at {ours.tokens_per_s / vllm['tokens_per_s']:.2f}x vLLM's "
                     "tokens/s on the same workload")
    lines.append(step_limit(split, machine))
    lines.append(kernel_choice(split, machine, choices))
    return lines


def step_limit(split: dict, machine: dict) -> str:
    """What bounds a decode step at the cap, from its measured phases."""
    cap = max(split, key=int)
    phases = split[cap]
    parts = {"the matmul library": phases["matmul"], "attention": phases["attention"],
             "the many small ops and the Python of the step": phases["forward_other"]
             + phases["sampling"] + phases["scheduling"]}
    name = max(parts, key=parts.get)
    line = (f"At batch {cap} a decode step took {1000 * phases['step']:.0f} ms, "
            f"{100 * parts[name] / phases['step']:.0f}% of it {name}")
    if name == "the matmul library":
        times = phases["matmul"] / machine["weight_read_s"]
        line += (f": {times:.1f}x one read of the weights, so the kernels on these skinny shapes, "
                 "more than memory, set the pace" if times > 1.5 else
                 f": {times:.1f}x one read of the weights, so memory bandwidth sets the pace")
    return line


def kernel_choice(split: dict, machine: dict, choices: dict) -> str:
    """The linear layers' kernel chosen at load, against the kernel floor through F.linear."""
    cap = max(split, key=int)
    matmul_ms, floor_ms = 1000 * split[cap]["matmul"], 1000 * machine["kernel_floor_s"][cap]
    chosen = sorted({c["chosen"] for c in choices["layers"].values()})
    verdict = ("faster than" if matmul_ms < 0.95 * floor_ms else
               "no faster than" if matmul_ms < 1.05 * floor_ms else "slower than")
    return (f"Its linear layers ran {' / '.join(chosen)}, measured fastest on this CPU at load: "
            f"{matmul_ms:.0f} ms a step at batch {cap}, {verdict} the {floor_ms:.0f} ms of the "
            "kernel floor through F.linear")


def check_budget(args, model_path: str, dtype: str) -> None:
    """--kv-bytes must hold one request of max_model_len in whole pages (fp32 for part 1, the
    lab's dtype for the rest), else one line and exit 2."""
    model_shape = ModelShape.from_folder(model_path)
    for name in ("float32", dtype):
        need = (kv.cdiv(settings.MAX_MODEL_LEN, args.page_size) * args.page_size
                * model_shape.kv_bytes_per_token(name))
        if args.kv_bytes < need:
            cli.fail(f"--kv-bytes {args.kv_bytes:,} cannot hold one request of "
                     f"{settings.MAX_MODEL_LEN} tokens ({need:,} B in {name})")


def load_models(model_path: str, dtype: str, batch_sizes) -> tuple[Llama, object]:
    """The engine's model and transformers' in this dtype (the linear layers' kernels are
    measured at batch_sizes as the engine's model loads)."""
    from transformers import AutoModelForCausalLM

    return (Llama(model_path, dtype, batch_sizes),
            AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype)).eval())


def run_policies(model: Llama, eos_ids, workload: list[Request], args, progress
                 ) -> tuple[dict[str, PolicyRun], dict[str, LLMEngine]]:
    """Part 2: the workload under each batching policy asked for, on the same engine."""
    plans = {"static": [("static", "static", True), ("static no-pad", "static", False)],
             "continuous": [("continuous", "continuous", True)]}
    runs, engines = {}, {}
    for label, policy, pad in [p for k, v in plans.items() if args.policy in (k, "both")
                               for p in v]:
        progress(f"Part 2: {label} batching...")
        runs[label], engines[label] = run_policy(model, eos_ids, workload, args, label, policy,
                                                 pad)
    return runs, engines


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model_choice = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    check_budget(args, model_choice.path, dtype.dtype)
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(settings.num_cores())
    report.title("Task 9: Build the Engine Yourself")
    report.run_info(model_choice, dtype, torch.get_num_threads(),
                    Engine=f"mini_engine, max_model_len={settings.MAX_MODEL_LEN}, "
                           f"KV {args.kv_bytes:,} B, pages of {args.page_size}, "
                           f"batch cap {args.max_batch}")
    tokenizer = AutoTokenizer.from_pretrained(model_choice.path)
    eos_ids, progress = eos_token_ids(model_choice.path), report.progress_clock()

    progress("Part 1: the engine against transformers, greedy...")
    batch_sizes = (1, args.max_batch)   # the linear layers' kernels are measured at these
    model, hf_model = load_models(model_choice.path, "float32", batch_sizes)
    correct = check_correctness(model, eos_ids, hf_model, tokenizer, args)
    if dtype.dtype != "float32":   # parts 2-4 run the lab's dtype
        model, hf_model = load_models(model_choice.path, dtype.dtype, batch_sizes)
    workload = make_workload(tokenizer, args.requests, args.mean_output, args.seed)
    runs, engines = run_policies(model, eos_ids, workload, args, progress)
    timelines = {label: figures.timeline_record(e.steps) for label, e in engines.items()}
    best = runs.get("continuous") or runs["static"]
    progress("Part 3: timing the phases of a step...")
    choices, split = linear_choices(model), phase_split(model, eos_ids, workload,
                                                        engines[best.label], args)
    machine = machine_figures(model, dtype.dtype, [int(b) for b in split])
    vllm = hf = None
    if not args.no_vllm:
        progress("Part 4: transformers' generate, static batches...")
        hf = run_hf_static(hf_model, tokenizer, workload, args.max_batch)
        del hf_model, model, engines   # vLLM's engine needs the memory they hold
        gc.collect()
        progress("Part 4: vLLM's LLM.generate...")
        vllm = run_vllm(model_choice.path, dtype.dtype, workload, args.max_batch)
    progress("done")

    print_report(correct, runs, best, vllm, hf, split, machine, choices, args, workload)
    data = result(args, correct, runs, best, vllm, hf, split, machine, choices, workload,
                  timelines)
    header = results.RunHeader.of(model_choice, dtype, torch.get_num_threads())
    figures.saved(results.save(SCRIPT, header, results.OwnEngine.from_dict(data)))
    return header.__dict__ | data


def print_report(correct: dict, runs: dict, best: PolicyRun, vllm: dict | None,
                 hf: dict | None, split: dict, machine: dict, choices: dict, args,
                 workload: list[Request]) -> None:
    """The four parts in their order, then the insight chosen from them."""
    print_correctness(correct)
    print_policies(list(runs.values()), args, workload)
    if "static" in runs and "continuous" in runs:
        report.row("Continuous / static",
                   f"{runs['continuous'].tokens_per_s / runs['static'].tokens_per_s:.2f}x "
                   f"tokens/s")
    print_phases(split, machine)
    print_linear_choices(choices)
    if not args.no_vllm:
        print_real_thing(best, vllm, hf, args)
    report.insight(insights(correct, runs, best, vllm, split, machine, choices))


def result(args, correct: dict, runs: dict, best: PolicyRun, vllm: dict | None,
           hf: dict | None, split: dict, machine: dict, choices: dict,
           workload: list[Request], timelines: dict) -> dict:
    """What task 9 saves (the batching timeline is drawn from its step records)."""
    data = {"settings": {"requests": args.requests, "mean_output": args.mean_output,
                         "seed": args.seed, "max_batch": args.max_batch,
                         "page_size": args.page_size, "kv_bytes": args.kv_bytes,
                         "max_model_len": settings.MAX_MODEL_LEN, "policy": args.policy,
                         "temperature": settings.TEMPERATURE},
            "correctness": correct,
            "workload_output_lengths": [r.num_output for r in workload],
            "policies": {label: asdict(r) for label, r in runs.items()},
            "phases": split, "machine": machine, "vllm": vllm, "transformers_static": hf,
            "timelines": timelines, "linear_choices": choices}
    if "static" in runs and "continuous" in runs:
        data["continuous_over_static"] = runs["continuous"].tokens_per_s / runs["static"].tokens_per_s
    if vllm:
        data["engine_over_vllm"] = best.tokens_per_s / vllm["tokens_per_s"]
    return data


if __name__ == "__main__":
    cli.run(main)
