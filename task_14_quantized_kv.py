"""Task 14: Half the Bytes a Token - a quantized KV cache, built in mini_engine, measured in vLLM.

Paging (tasks 3-4) stops wasting KV memory, but a token still costs what it costs: 23,040 B in
bf16 for SmolLM2-135M. Stored in 8 bits the same memory holds about twice the tokens, and twice
the users. What it costs is the lesson: an 8-bit float keeps 3 bits of mantissa, and each value
is stored divided by a scale. mini_engine keeps the scales where this task chooses
(mini_engine/kv_quant.py): one a layer, 1.0, as vLLM does on a CPU without calibrated scales, or
one for each token's K and V in each head, computed when written. It prints three parts:
1. The arithmetic, exact: a token's bytes with each format (its scales counted), the pages, the
   tokens and the users of 128 tokens in 128 MiB, derived and read from both engines.
2. What it costs: greedy answers against the model's dtype (identical, the first token that
   differs, empty or stuck answers), and the log-probabilities of a real text (the GPL-3),
   teacher-forced: the mean change and the perplexity. mini_engine at each format and scale,
   vLLM at --kv-cache-dtype fp8 (e4m3) and fp8_e5m2.
3. What it buys: requests with long prompts, all at once through a small KV budget, the
   model's dtype against 8 bits, in both engines: requests running at once, preemptions,
   tokens/s, TPOT.

This file sets up and measures, then prints; beside it in lessons/task_14/: mini_engine's runs and
the comparisons (quality.py), vLLM's server runs (vllm_side.py), the record and the summary's row
(record.py), the printing and the insights (report.py), the figure (figure.py).

    python task_14_quantized_kv.py [--prompts 8] [--max-tokens 50] [--passage 256]
        [--load-requests 16] [--load-tokens 48] [--load-mib 16] [--quick] [--no-vllm]
        [--port 8000] [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import functools

from common import cli, figures, measure, own_engines, results, server, settings
from common.shape import ModelShape, max_model_len_for
from common.texts import source_text, templated
from lessons.task_14 import FIGURES, vllm_side
from lessons.task_14 import quality as q
from lessons.task_14.record import Capacity, Quality, QuantizedKV, Settings, Throughput, label
from lessons.task_14.report import print_report, print_run_info
from mini_engine import Llama
from mini_engine.kv_quant import bytes_per_token

SCRIPT = "task_14_quantized_kv"
DEFAULTS = {"prompts": 8, "max_tokens": 50, "passage": 256, "load_requests": 16,
            "load_tokens": 48}
QUICK = {"prompts": 4, "max_tokens": 16, "passage": 128, "load_requests": 6, "load_tokens": 16}
# part 3's prompts: windows of the text this long. A long prompt is what makes memory bind: a
# request holds its pages from its first step, and a preempted one computes its prompt again
# (with the lab's short questions both engines ran about as many requests at once in 8 bits as
# in bf16, preempting and recomputing cheaply: docs/measurements.md)
LOAD_PROMPT_TOKENS = 200
PAGE = 32             # vLLM's CPU cache refuses 8 bits in blocks of 16 (cpu_attn.py)
USER_TOKENS = 128     # part 1's user: a request of the lab's max_model_len
MAX_MODEL_LEN = 512   # parts 2-3's longest request may be this long (the passage, 256 tokens
                      # by default, and a chat answer or a load prompt and its answer: less)
# mini_engine's formats: (kv_cache_dtype, kv_scale); vLLM's: its --kv-cache-dtype, one scale a
# layer (1.0 without calibration)
MINI_FORMATS = [("fp8", "layer"), ("fp8", "token"), ("fp8_e5m2", "layer"), ("fp8_e5m2", "token")]
VLLM_FORMATS = {"fp8": ("fp8", "layer"), "fp8_e5m2": ("fp8_e5m2", "layer")}
QUESTIONS = ["What is the capital of France?", "Explain what a KV cache is.",
             "Write a haiku about the sea.", "What is 12 times 7?", "Name three colors.",
             "Why is the sky blue?", "Give me a tip for learning Python.", "What does a CPU do?",
             "What is a prime number?", "How do plants make food?", "What is an API?",
             "Tell me a fun fact about cats."]


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("workload")
    group.add_argument("--prompts", type=cli.positive_int, default=None,
                       help=f"part 2: chat prompts, greedy (default {DEFAULTS['prompts']}, at "
                            f"most {len(QUESTIONS)})")
    group.add_argument("--max-tokens", type=cli.positive_int, default=None,
                       help=f"part 2: tokens an answer at most (default {DEFAULTS['max_tokens']})")
    group.add_argument("--passage", type=cli.positive_int, default=None,
                       help=f"part 2: tokens of the GPL-3 passage (default {DEFAULTS['passage']})")
    group.add_argument("--load-requests", type=cli.positive_int, default=None,
                       help=f"part 3: requests at once (default {DEFAULTS['load_requests']})")
    group.add_argument("--load-tokens", type=cli.positive_int, default=None,
                       help=f"part 3: tokens an answer (default {DEFAULTS['load_tokens']})")
    group.add_argument("--load-mib", type=cli.positive_int, default=16,
                       help="part 3: the KV budget in MiB, both engines (default 16)")
    group.add_argument("--quick", action="store_true",
                       help="a smaller run: --prompts 4 --max-tokens 16 --passage 128 "
                            "--load-requests 6 --load-tokens 16, vLLM at fp8 only (flags given "
                            "win)")
    group.add_argument("--no-vllm", action="store_true", help="skip vLLM's side")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    cli.add_kernels_arg(parser)
    cli.add_model_args(parser)
    args = cli.fill_unset(parser.parse_args(argv), DEFAULTS, QUICK)
    if args.prompts > len(QUESTIONS):
        parser.error(f"--prompts {args.prompts}: at most {len(QUESTIONS)}")
    if args.passage < 2:
        parser.error("--passage: at least 2 tokens (the first has no log-probability)")
    return args


def settings_of(args, model_path: str, dtype: str, longest: int) -> Settings:
    """The flags as the record saves them, with max_model_len: the longest request of parts 2-3
    (longest tokens: a chat prompt and its answer, a load prompt and its answer, or the passage
    and the one token vLLM makes after it). One line and exit 2 where it cannot fit the model, or
    where part 3's budget cannot hold one such request in the model's dtype (vLLM refuses it)."""
    limit = max_model_len_for(model_path, MAX_MODEL_LEN)
    if longest > limit:
        cli.fail(f"a request of {longest} tokens (see --passage, --max-tokens, --load-tokens) "
                 f"does not fit this task's max_model_len of {limit}")
    per_page = PAGE * ModelShape.from_folder(model_path).kv_bytes_per_token(dtype)
    holds = (args.load_mib << 20) // per_page * PAGE
    if holds < longest:
        cli.fail(f"--load-mib {args.load_mib} holds {holds} tokens in {dtype}: fewer than one "
                 f"request of {longest}")
    return Settings(PAGE, settings.KV_CACHE_BYTES, USER_TOKENS, args.prompts, args.max_tokens,
                    args.passage, longest, args.load_mib << 20, args.load_requests,
                    LOAD_PROMPT_TOKENS, args.load_tokens, args.port, not args.no_vllm,
                    kv_read(args.kernels), args.kernels)


def kv_read(kernels: str) -> str:
    """How part 3's mini_engine writes and reads its 8-bit pages, for the report."""
    from mini_engine.kernels import kv_quant as c_kv
    if kernels != "torch" and c_kv.available():
        return "one pass of C each (mini_engine/kernels/kv_quant.c)"
    return "torch's operations" + (" (--kernels torch)" if kernels == "torch" else
                                   " (kv_quant.c could not be built here)")


def load_windows(tokenizer, text: str, args) -> list[str]:
    """Part 3's prompts: --load-requests windows of the text, LOAD_PROMPT_TOKENS tokens each,
    after the passage, as text (both engines tokenize the same strings)."""
    ids = tokenizer(text).input_ids[args.passage:]
    windows = [ids[i * LOAD_PROMPT_TOKENS:(i + 1) * LOAD_PROMPT_TOKENS]
               for i in range(args.load_requests)]
    if len(windows[-1]) < LOAD_PROMPT_TOKENS:
        cli.fail(f"--load-requests {args.load_requests}: the text holds fewer windows of "
                 f"{LOAD_PROMPT_TOKENS} tokens")
    return [tokenizer.decode(w) for w in windows]


# --- part 1: the arithmetic ----------------------------------------------------------------------
def capacities(model, eos, s: Settings) -> list[Capacity]:
    """A row a format: the run's dtype, the other of bf16 and fp32, fp8 with each scale
    (fp8_e5m2 costs the same bytes); pages derived, and read from an engine where the model's
    dtype allows one."""
    import torch

    dtypes = [model.dtype] + [d for d in (torch.bfloat16, torch.float32) if d != model.dtype]
    rows = [(("auto", "token"), d) for d in dtypes] + [(kv, model.dtype) for kv in MINI_FORMATS[:2]]
    out = []
    for kv, dtype in rows:
        per_token = bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, *kv,
                                    dtype)
        name = label(kv[0], kv[1], str(dtype).removeprefix("torch."))
        read = (q.engine(model, eos, kv, s.kv_cache_bytes, s.page_tokens, s.user_tokens).num_pages
                if dtype == model.dtype else None)
        out.append(Capacity(name, per_token, s.kv_cache_bytes // (per_token * s.page_tokens),
                            s.load_kv_bytes // (per_token * s.page_tokens), read))
    return out


# --- parts 2-3, mini_engine -----------------------------------------------------------------------
def measure_engine(model, eos, prompts, passage, load_prompts, s: Settings, dtype: str, progress):
    """(reference perplexity, reference empty and stuck answers, qualities, throughputs) of
    mini_engine."""
    base = ("auto", "token")
    answers = {kv: q.greedy_answers(model, eos, prompts, s.max_tokens, kv, s.page_tokens,
                                    s.kv_cache_bytes) for kv in [base, *MINI_FORMATS]}
    logprobs = {kv: q.passage_logprobs(model, passage, kv, s.page_tokens)
                for kv in [base, *MINI_FORMATS]}
    qualities = [quality_of("mini_engine", label(*kv, dtype), eos, answers[base], answers[kv],
                            logprobs[base], logprobs[kv]) for kv in MINI_FORMATS]
    progress("Part 3: mini_engine, the model's dtype, then fp8...")
    runs = load_in_turns(model, eos, [base, ("fp8", "token")], dtype, load_prompts, s)
    return (q.perplexity(logprobs[base]), sum(q.is_empty(a, eos) for a in answers[base]),
            sum(q.is_stuck(a) for a in answers[base]), qualities, runs)


def load_in_turns(model, eos, formats: list[tuple[str, str]], dtype: str, load_prompts,
                  s: Settings, passes: int = measure.PASSES) -> list[Throughput]:
    """Part 3's load in each format, the formats taking turns for `passes` passes; each keeps
    its median pass by tokens/s, with every pass's tokens/s beside it."""
    ways = {kv: functools.partial(q.load_run, model, eos, kv, label(*kv, dtype), load_prompts,
                                  s.load_tokens, s.load_kv_bytes, s.page_tokens, s.load_requests,
                                  s.kernels)
            for kv in formats}
    found = measure.in_turns(ways, passes, warm_up=False)
    median = []
    for runs in found.values():
        run = measure.median_pass(runs, lambda t: t.tokens_per_s)
        run.tokens_per_s_spread = measure.Spread.of(t.tokens_per_s for t in runs)
        median.append(run)
    return median


def quality_of(engine: str, name: str, eos, base_answers, answers, base_logprobs,
               logprobs) -> Quality:
    """One format against the model's dtype, in the same engine."""
    firsts = [q.first_difference(a, b) for a, b in zip(base_answers, answers)]
    # each token's change kept (to 1e-5, far below the 0.01s the report reads) for its spread
    return Quality(engine, name, sum(f is None for f in firsts), firsts,
                   sum(q.is_empty(a, eos) for a in answers), sum(q.is_stuck(a) for a in answers),
                   q.mean_abs_change(base_logprobs, logprobs), q.perplexity(logprobs),
                   [round(b - a, 5) for a, b in zip(base_logprobs, logprobs, strict=True)])


# --- parts 1-3, vLLM ------------------------------------------------------------------------------
def measure_vllm(model_choice, dtype: str, eos, prompts, passage, load_texts, s: Settings,
                 record: QuantizedKV, kv_dtypes: list[str], progress) -> None:
    """One server a --kv-cache-dtype ("auto" first: the reference), each read, asked and loaded;
    stopped at the end (this task started them). A dtype vLLM refuses here, at its start or at
    its first forward (an 8-bit cache on a CPU without AVX-512: cpu_attn.py), is one line in
    the record, and the rest runs."""
    base: list = []
    try:
        for kv_dtype in ["auto", *kv_dtypes]:
            progress(f"vLLM's server, --kv-cache-dtype {kv_dtype}...")
            try:
                measure_vllm_dtype(model_choice, dtype, kv_dtype, eos, prompts, passage,
                                   load_texts, s, record, base)
            except (server.ServerError, OSError) as e:
                if kv_dtype == "auto":
                    raise
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                refused = f"vLLM refused --kv-cache-dtype {kv_dtype} here: {first}"
                record.vllm_skipped = "; ".join(filter(None, [record.vllm_skipped, refused]))
                server.stop_server(s.port)
    finally:
        server.stop_server(s.port)


def measure_vllm_dtype(model_choice, dtype: str, kv_dtype: str, eos, prompts, passage,
                       load_texts, s: Settings, record: QuantizedKV, base: list) -> None:
    """One --kv-cache-dtype: its blocks, answers and passage; the load for auto and fp8. base:
    auto's answers and log-probabilities, filled by auto's run, read by the others."""
    srv = vllm_side.start(model_choice, dtype, kv_dtype, s)
    name = dtype if kv_dtype == "auto" else label(*VLLM_FORMATS[kv_dtype], dtype)
    if kv_dtype != "fp8_e5m2":                  # its blocks are fp8's: the same bytes a token
        record.capacity_of(name).vllm_blocks = vllm_side.blocks(srv)
    answers = vllm_side.answers(srv, prompts, s.max_tokens)
    logprobs = vllm_side.passage_logprobs(srv, passage)
    if not base:
        base += [answers, logprobs]
        record.reference_perplexity["vLLM"] = q.perplexity(logprobs)
        record.reference_empty["vLLM"] = sum(q.is_empty(a, eos) for a in answers)
        record.reference_stuck["vLLM"] = sum(q.is_stuck(a) for a in answers)
    else:
        record.quality.append(quality_of("vLLM", name, eos, base[0], answers, base[1],
                                         logprobs))
    if kv_dtype in ("auto", "fp8"):
        run, error = vllm_side.load_run(srv, name, load_texts, s.load_tokens, s.page_tokens)
        if error:
            raise server.ServerError(f"part 3's load failed on vLLM: {error}")
        record.throughput.append(run)


def main(argv: list[str] | None = None) -> QuantizedKV:
    args = parse_args(argv)
    model_choice, dtype, tokenizer, eos_ids, progress, header = own_engines.start(args)
    prompts = [tokenizer(templated(tokenizer, question)).input_ids
               for question in QUESTIONS[:args.prompts]]
    path, text, text_note = source_text("the passage")
    passage = tokenizer(text).input_ids[:args.passage]
    load_texts = load_windows(tokenizer, text, args)
    load_prompts = [tokenizer(t).input_ids for t in load_texts]
    longest = max(len(passage) + 1, max(map(len, prompts)) + args.max_tokens,
                  max(map(len, load_prompts)) + args.load_tokens)
    s = settings_of(args, model_choice.path, dtype.dtype, longest)
    print_run_info(model_choice, dtype, header.threads, s, path.name, text_note)

    progress("Parts 1-2: mini_engine, each KV cache format...")
    model, eos = Llama(model_choice.path, dtype.dtype), eos_ids
    record = QuantizedKV(s, capacities(model, eos, s), {}, {}, header=header)
    perplexity, empty, stuck, qualities, runs = measure_engine(
        model, eos, prompts, passage, load_prompts, s, dtype.dtype, progress)
    record.reference_perplexity["mini_engine"] = perplexity
    record.reference_empty["mini_engine"], record.reference_stuck["mini_engine"] = empty, stuck
    record.quality, record.throughput = qualities, runs
    del model
    if s.is_vllm_measured:
        measure_vllm(model_choice, dtype.dtype, eos, prompts, passage, load_texts, s,
                     record, ["fp8"] if args.quick else list(VLLM_FORMATS), progress)
    progress("done")

    print_report(record)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
