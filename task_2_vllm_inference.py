"""Task 2: vLLM Offline Inference - see the difference.

Runs the same model, prompt and sampling as task 1 with vllm.LLM (in-process CPU engine,
max_model_len 128, 128 MiB KV cache, enforce_eager), after one untimed warm-up. Prints the
result, the HuggingFace-vs-vLLM comparison (task 1's saved result when it matches, else the
baseline measured here), and the KV capacity the engine allocated beside the same figure derived
from the model config: bytes per token x 128 MiB, in whole blocks. The two must agree.

    python task_2_vllm_inference.py [--model M] [--dtype auto|bfloat16|float32] [--prompt TEXT]
"""
from __future__ import annotations

from common import cli, engine, figures, kv, measure, report, results, settings
from lessons.task_2 import FIGURES
from lessons.task_2.record import Baseline, Capacity, EngineSettings, VLLMInference

SCRIPT = "task_2_vllm_inference"
BASELINE_SCRIPT = "task_1_hf_baseline"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_sampling_args(parser)
    return parser.parse_args(argv)


def load_baseline(model, dtype: str, prompt: str, max_tokens: int) -> Baseline:
    """Task 1's saved result if it measured the same thing, else measure the baseline here."""
    try:
        saved = results.load(BASELINE_SCRIPT, engine.OneRequest, "task 1")
    except results.StaleResult as e:
        report.note(f"({e})")
        saved = None
    if (saved and saved.header.model_path == model.path and saved.header.dtype == dtype
            and saved.settings.prompt == prompt and saved.settings.max_new_tokens == max_tokens
            and saved.total_time_s):
        return Baseline(f"task 1's saved result ({saved.measured_at})", saved.tokens_per_s,
                        saved.total_time_s,
                        [saved.generated_tokens / t for t in saved.pass_times_s])
    report.note("No matching task 1 result saved: measuring the HuggingFace baseline now...")
    gen = engine.hf_generate(model.path, dtype, prompt, max_tokens)
    return Baseline("measured now", round(gen.tokens_per_s, 2), gen.total_time_s,
                    [gen.generated_tokens / t for t in gen.pass_times_s])


def one_request_line(gen: engine.Generation, baseline: Baseline) -> str:
    """vLLM against HuggingFace with one request, told apart only where their passes are."""
    ours = measure.Spread.of(gen.generated_tokens / t for t in gen.pass_times_s) \
        if gen.pass_times_s else None
    theirs = baseline.spread
    figures = (f"vLLM {gen.tokens_per_s:.1f} against HuggingFace {baseline.tokens_per_s:.1f} "
               "tok/s")
    passes = bool(ours and theirs and ours.num_passes > 1 and theirs.num_passes > 1)
    if passes and ours.overlaps(theirs):
        verdict = "within each other's passes: the same speed"
    else:
        ratio = gen.tokens_per_s / baseline.tokens_per_s
        verdict = (f"{ratio:.2f}x, {'faster' if ratio >= 1 else 'slower'}"
                   + ("" if passes else " (one pass: not told apart from the machine's drift)"))
    return (f"One request: {figures}, {verdict}. One sequence gives the engine nothing to "
            "batch, so whatever differs here is not batching")


def compare_capacity(capacity: kv.KVCapacity, model_kv: kv.ModelKV, block_size: int,
                     max_model_len: int) -> tuple[kv.KVCapacity, bool]:
    """Print the KV capacity the engine allocated beside the one derived from the model config
    and the lab's settings (128 MiB, block size, max_model_len); return (derived, agree)."""
    derived = kv.derive_capacity(model_kv.bytes_per_token, settings.KV_CACHE_BYTES, block_size,
                                 max_model_len)
    report.section("KV CACHE CAPACITY")
    report.table(["", "Engine (read)", "Derived"],
                 [("Blocks", capacity.num_blocks, derived.num_blocks),
                  ("Block size (tokens)", capacity.block_size, derived.block_size),
                  ("KV cache size (tokens)", f"{capacity.num_tokens:,}", f"{derived.num_tokens:,}"),
                  ("max_model_len (tokens)", capacity.max_model_len, derived.max_model_len),
                  ("Max concurrency (requests)", f"{capacity.max_concurrency:.2f}x",
                   f"{derived.max_concurrency:.2f}x")],
                 widths=[28, 16, 12])
    report.note(f"Derived: {settings.KV_CACHE_BYTES:,} B // ({model_kv.bytes_per_token:,} B/token "
                f"x {derived.block_size} tokens/block) = {derived.num_blocks} blocks")
    report.note(f"where {model_kv.bytes_per_token:,} B/token = {model_kv.formula()}", indent=2)
    agree = capacity == derived
    report.note("Engine and config agree to the block." if agree else
                "MISMATCH: the engine did not allocate what the lab's settings and the model "
                "config give (see the rows that differ).")
    return derived, agree


def print_results(gen: engine.Generation, eng: engine.Engine, baseline: Baseline) -> float:
    """vLLM's figures, then HuggingFace vs vLLM; returns the speedup in tokens/s."""
    report.section("vLLM RESULTS")
    report.note(f"Generated text: {gen.text[:120] + ('...' if len(gen.text) > 120 else '')!r}")
    report.row("Generated tokens", gen.generated_tokens)
    report.row("Engine start-up (s)", f"{eng.init_time_s:.2f}")
    report.row("Total time (s)", engine.time_text(gen.total_time_s, gen.pass_times_s))
    report.row("Tokens per second (tok/s)", f"{gen.tokens_per_s:.1f}")
    # rounded as it is saved, so the report and the summary's row (read from the save) say the
    # same: 1.1503 printed here as 1.2x, saved as 1.15, read back as 1.1x
    speedup = round(gen.tokens_per_s / baseline.tokens_per_s, 2)
    report.section("COMPARISON: HuggingFace vs vLLM")
    report.note(f"HuggingFace baseline: {baseline.source}")
    report.table(["Metric", "HuggingFace", "vLLM"],
                 [("Tokens/sec", f"{baseline.tokens_per_s:.1f}", f"{gen.tokens_per_s:.1f}"),
                  ("Total time", f"{baseline.total_time_s:.2f}s", f"{gen.total_time_s:.2f}s")],
                 widths=[20, 14, 12])
    # a ratio, not a verdict: whether the two can be told apart is the insight's, by their passes
    report.note(f"vLLM made {speedup:.1f}x HuggingFace's tokens/sec")
    return speedup


def result(args, gen: engine.Generation, eng: engine.Engine, baseline: Baseline, speedup: float,
           capacity: kv.KVCapacity, derived: kv.KVCapacity, model_kv: kv.ModelKV, agree: bool,
           header: results.RunHeader) -> VLLMInference:
    """What task 2 saves: the generation, the comparison, the capacity read and derived."""
    e = eng.settings
    asked = EngineSettings(args.prompt, args.max_tokens, settings.TEMPERATURE, settings.SEED,
                           e["max_model_len"], e["kv_cache_memory_bytes"], e["block_size"],
                           e["enforce_eager"], e["dtype"])
    return VLLMInference.of(gen, asked, header, baseline=baseline, speedup=round(speedup, 2),
                            kv_capacity_engine=Capacity.of(capacity),
                            kv_capacity_derived=Capacity.of(derived, model_kv.bytes_per_token),
                            kv_capacity_agree=agree)


def main(argv: list[str] | None = None) -> VLLMInference:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    cli.check_prompt_fits(model.path, args.prompt, args.max_tokens)

    report.title("Task 2: vLLM Offline Inference - See the Difference")
    report.row("Prompt", f'"{args.prompt}"')
    baseline = load_baseline(model, dtype.dtype, args.prompt, args.max_tokens)
    print("Initializing vLLM engine...", flush=True)
    eng = engine.start_engine(model.path, dtype.dtype)
    print(f"vLLM engine ready ({eng.init_time_s:.1f} s). Generating with vLLM...", flush=True)
    gen = engine.vllm_generate(eng, args.prompt, args.max_tokens)
    capacity = engine.engine_capacity(eng)

    report.section("WHAT RAN")
    report.run_info(model, dtype, gen.threads,
                    Engine=", ".join(f"{k}={v}" for k, v in eng.settings.items()),
                    Mode="in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), CPU",
                    Sampling=f"temperature={settings.TEMPERATURE}, seed={settings.SEED}, "
                             f"{args.max_tokens} new tokens (EOS held off)")
    speedup = print_results(gen, eng, baseline)
    # derived from what the lab asked for (block size, max_model_len), never read back from the
    # engine, so the check fails if the engine did not apply it
    model_kv = kv.ModelKV.from_folder(model.path, dtype.dtype)
    derived, agree = compare_capacity(capacity, model_kv, eng.settings["block_size"],
                                      eng.settings["max_model_len"])
    report.insight([
        one_request_line(gen, baseline),
        # whole requests: 45.5 is 45 that fit, not 46
        f"The engine's real lever is capacity: {capacity.num_tokens:,} KV tokens = "
        f"{int(capacity.max_concurrency)} whole requests of {capacity.max_model_len} tokens at "
        "once",
        "The REAL advantage shows under concurrent load (task 6)",
    ])

    record = result(args, gen, eng, baseline, speedup, capacity, derived, model_kv, agree,
                    results.RunHeader.of(model, dtype, gen.threads))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
