"""Task 2: vLLM Offline Inference - see the difference.

Runs the same model, prompt and sampling as task 1 with vllm.LLM (in-process CPU engine,
max_model_len 128, 128 MiB KV cache, enforce_eager), after one untimed warm-up. Prints the
result, the HuggingFace-vs-vLLM comparison (task 1's saved result when it matches, else the
baseline measured here), and the KV capacity the engine allocated beside the same figure derived
from the model config: bytes per token x 128 MiB, in whole blocks. The two must agree.

    python task_2_vllm_inference.py [--model M] [--dtype auto|bfloat16|float32] [--prompt TEXT]
"""
from __future__ import annotations

from common import cli, engine, figures, kv, report, results, settings

SCRIPT = "task_2_vllm_inference"
BASELINE_SCRIPT = "task_1_hf_baseline"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_sampling_args(parser)
    return parser.parse_args(argv)


def load_baseline(model, dtype: str, prompt: str, max_tokens: int) -> tuple[dict, str]:
    """Task 1's saved result if it measured the same thing, else measure the baseline here."""
    try:
        saved = results.load(BASELINE_SCRIPT)
    except results.StaleResult as e:
        report.note(f"({e})")
        saved = None
    if (saved and saved.header.model_path == model.path and saved.header.dtype == dtype
            and saved.extra.get("settings", {}).get("prompt") == prompt
            and saved.extra.get("settings", {}).get("max_new_tokens") == max_tokens
            and saved.total_time_s):
        return saved.to_dict(), f"task 1's saved result ({saved.measured_at})"
    report.note("No matching task 1 result saved: measuring the HuggingFace baseline now...")
    return engine.hf_generate(model.path, dtype, prompt, max_tokens).to_dict(), "measured now"


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


def print_results(gen: engine.Generation, eng: engine.Engine, baseline: dict,
                  baseline_source: str) -> float:
    """vLLM's figures, then HuggingFace vs vLLM; returns the speedup in tokens/s."""
    report.section("vLLM RESULTS")
    report.note(f"Generated text: {gen.text[:120] + ('...' if len(gen.text) > 120 else '')!r}")
    report.row("Generated tokens", gen.generated_tokens)
    report.row("Engine start-up (s)", f"{eng.init_time_s:.2f}")
    report.row("Total time (s)", f"{gen.total_time_s:.2f} (one warm-up run excluded)")
    report.row("Tokens per second (tok/s)", f"{gen.tokens_per_s:.1f}")
    speedup = gen.tokens_per_s / baseline["tokens_per_s"]
    report.section("COMPARISON: HuggingFace vs vLLM")
    report.note(f"HuggingFace baseline: {baseline_source}")
    report.table(["Metric", "HuggingFace", "vLLM"],
                 [("Tokens/sec", f"{baseline['tokens_per_s']:.1f}", f"{gen.tokens_per_s:.1f}"),
                  ("Total time", f"{baseline['total_time_s']:.2f}s", f"{gen.total_time_s:.2f}s")],
                 widths=[20, 14, 12])
    report.note(f"vLLM is {speedup:.1f}x {'faster' if speedup >= 1 else 'as fast'} in tokens/sec")
    return speedup


def result(args, gen: engine.Generation, eng: engine.Engine, baseline: dict,
           baseline_source: str, speedup: float, capacity: kv.KVCapacity,
           derived: kv.KVCapacity, model_kv: kv.ModelKV, agree: bool) -> dict:
    """What task 2 saves: the generation, the comparison, the capacity read and derived."""
    return {"settings": {"prompt": args.prompt, "max_new_tokens": args.max_tokens,
                         "temperature": settings.TEMPERATURE, "seed": settings.SEED,
                         **eng.settings},
            **gen.to_dict(),
            "baseline": {"source": baseline_source, "tokens_per_s": baseline["tokens_per_s"],
                         "total_time_s": baseline["total_time_s"]},
            "speedup": round(speedup, 2),
            "kv_capacity_engine": {"num_blocks": capacity.num_blocks,
                                   "block_size": capacity.block_size,
                                   "num_tokens": capacity.num_tokens,
                                   "max_concurrency": capacity.max_concurrency},
            "kv_capacity_derived": {"num_blocks": derived.num_blocks,
                                    "num_tokens": derived.num_tokens,
                                    "max_concurrency": derived.max_concurrency,
                                    "kv_bytes_per_token": model_kv.bytes_per_token},
            "kv_capacity_agree": agree}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    cli.check_prompt_fits(model.path, args.prompt, args.max_tokens)

    report.title("Task 2: vLLM Offline Inference - See the Difference")
    report.row("Prompt", f'"{args.prompt}"')
    baseline, baseline_source = load_baseline(model, dtype.dtype, args.prompt, args.max_tokens)
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
    speedup = print_results(gen, eng, baseline, baseline_source)
    # derived from what the lab asked for (block size, max_model_len), never read back from the
    # engine, so the check fails if the engine did not apply it
    model_kv = kv.ModelKV.from_folder(model.path, dtype.dtype)
    derived, agree = compare_capacity(capacity, model_kv, eng.settings["block_size"],
                                      eng.settings["max_model_len"])
    report.insight([
        f"One request: vLLM {gen.tokens_per_s:.1f} vs HuggingFace {baseline['tokens_per_s']:.1f} "
        f"tok/s - one sequence cannot use the engine's batching",
        f"The engine's real lever is capacity: {capacity.num_tokens:,} KV tokens = "
        f"{capacity.max_concurrency:.0f} requests of {capacity.max_model_len} tokens at once",
        "The REAL advantage shows under concurrent load (task 6)",
    ])

    header = results.RunHeader.of(model, dtype, gen.threads)
    data = result(args, gen, eng, baseline, baseline_source, speedup, capacity, derived,
                  model_kv, agree)
    figures.saved(results.save(SCRIPT, header, results.VLLMInference.from_dict(data)))
    return header.__dict__ | data


if __name__ == "__main__":
    cli.run(main)
