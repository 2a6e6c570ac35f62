"""Task 2's report (task_2_vllm_inference.py prints it once it has generated): what ran, vLLM's
figures, HuggingFace against vLLM, the KV capacity the engine allocated beside the one derived
from the model config, and the insight lines chosen from them. Printing only."""
from __future__ import annotations

from common import engine, fmt, kv, measure, report, settings
from lessons.task_1.report import shown_text
from lessons.task_2.record import Baseline


def print_what_ran(model, dtype, gen: engine.Generation, eng: engine.Engine,
                   max_tokens: int) -> None:
    report.section("WHAT RAN")
    report.run_info(model, dtype, gen.threads,
                    Engine=", ".join(f"{k}={v}" for k, v in eng.settings.items()),
                    Mode="in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), CPU",
                    Sampling=f"temperature={settings.TEMPERATURE}, seed={settings.SEED}, "
                             f"{max_tokens} new tokens (EOS held off)")


def print_results(gen: engine.Generation, eng: engine.Engine, baseline: Baseline) -> float:
    """vLLM's figures, then HuggingFace vs vLLM; returns the speedup in tokens/s."""
    report.section("vLLM RESULTS")
    report.note(f"Generated text: {shown_text(gen.text)}")
    report.row("Generated tokens", gen.generated_tokens)
    report.row("Engine start-up (s)", fmt.secs(eng.init_time_s))
    report.row("Total time (s)", engine.time_text(gen.total_time_s, gen.pass_times_s))
    report.row("Tokens per second (tok/s)", f"{gen.tokens_per_s:.1f}")
    # rounded as it is saved, so the report and the summary's row (read from the save) say the
    # same: 1.1503 printed here as 1.2x, saved as 1.15, read back as 1.1x
    speedup = round(gen.tokens_per_s / baseline.tokens_per_s, 2)
    report.section("COMPARISON: HuggingFace vs vLLM")
    report.note(f"HuggingFace baseline: {baseline.source}")
    report.table(["Metric", "HuggingFace", "vLLM"],
                 [("Tokens/sec", f"{baseline.tokens_per_s:.1f}", f"{gen.tokens_per_s:.1f}"),
                  ("Total time", f"{fmt.secs(baseline.total_time_s)}s",
                   f"{fmt.secs(gen.total_time_s)}s")],
                 widths=[20, 14, 12])
    # a ratio, not a verdict: whether the two can be told apart is the insight's, by their passes
    report.note(f"vLLM made {speedup:.1f}x HuggingFace's tokens/sec")
    return speedup


def compare_capacity(capacity: kv.KVCapacity, model_kv: kv.ModelKV, block_size: int,
                     max_model_len: int) -> tuple[kv.KVCapacity, bool]:
    """Print the KV capacity the engine allocated beside the one derived from the model config
    and the lab's settings (128 MiB, block size, max_model_len); return (derived, agree)."""
    derived = kv.derive_capacity(model_kv.bytes_per_token, settings.KV_CACHE_BYTES, block_size,
                                 max_model_len)
    report.section("KV CACHE CAPACITY")
    report.note(f"vLLM hands out its KV cache by the {report.term('block')}, "
                f"{block_size} tokens each.")
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


def one_request_line(gen: engine.Generation, baseline: Baseline) -> str:
    """vLLM against HuggingFace with one request: two ways, told apart only where their passes
    do not overlap (measure.Spread.overlaps), and with one pass not told apart at all."""
    ours = measure.Spread.of(gen.generated_tokens / t for t in gen.pass_times_s) \
        if gen.pass_times_s else None
    theirs = baseline.spread
    v, hf = gen.tokens_per_s, baseline.tokens_per_s
    ratio = fmt.times(v / hf)
    if not (ours and theirs and ours.num_passes > 1 and theirs.num_passes > 1):
        return (f"One request: vLLM {v:.1f} against HuggingFace {hf:.1f} tok/s ({ratio}), "
                "with one pass of a way: not told apart from the machine's drift. One "
                "sequence gives the engine nothing to batch.")
    if ours.overlaps(theirs):
        return (f"One request: vLLM {v:.1f} against HuggingFace {hf:.1f} tok/s, within each "
                "other's passes: not told apart. One sequence gives the engine nothing to "
                "batch, so batching is not what this compares.")
    if v >= hf:
        return (f"One request: vLLM {v:.1f} against HuggingFace {hf:.1f} tok/s, {ratio} "
                "faster beyond the passes of both. One sequence gives the engine nothing to "
                "batch, so this gain is not batching.")
    return (f"One request: vLLM {v:.1f} against HuggingFace {hf:.1f} tok/s, {ratio}: slower "
            "beyond the passes of both. One sequence gives the engine nothing to batch, so "
            "batching cannot help it here.")


def capacity_line(capacity: kv.KVCapacity) -> str:
    """The engine's lever, from the capacity it allocated: whole requests (45.5 is 45 that fit,
    not 46)."""
    return (f"The engine's lever is capacity: its KV cache holds {capacity.num_tokens:,} tokens, "
            f"{int(capacity.max_concurrency)} whole requests of {capacity.max_model_len} tokens "
            "at once; task 6 puts them to work under concurrent load.")


def insights(gen: engine.Generation, baseline: Baseline, capacity: kv.KVCapacity) -> list[str]:
    return [one_request_line(gen, baseline), capacity_line(capacity)]
