"""Task 14's report (task_14_quantized_kv.py prints it, in this order): what ran, the three parts
(the arithmetic, the quality, the throughput) and the KEY INSIGHT lines, each chosen from the
figures it states. Printing only, from the record (lessons/task_14/record.py). How each figure
was taken is printed inside report.detail(): with --detail, or on the report page."""
from __future__ import annotations

from common import fmt, report
from lessons.task_14.record import (PERPLEXITY_BOUND, Quality, QuantizedKV, Shift,
                                    answers_told_apart, change_gap, perplexity_change)

MIB = 1 << 20
SHORT = {"mini_engine": "mini", "vLLM": "vLLM"}       # the tables' engine names


def print_run_info(model_choice, dtype, threads: int, s, source: str, note: str | None) -> None:
    report.title("Task 14: Half the Bytes a Token - a Quantized KV Cache")
    engines = ("mini_engine (kv_cache_dtype, kv_scale) and vLLM (--kv-cache-dtype, its server)"
               if s.is_vllm_measured else "mini_engine (kv_cache_dtype, kv_scale)")
    report.run_info(model_choice, dtype, threads, Engines=engines)
    report.note(f"An {report.term('fp8')} KV cache against the model's dtype; each "
                f"{report.term('block')} holds {s.page_tokens} tokens. Quality: {s.num_prompts} "
                f"chat prompts, {report.term('greedy')}, at most {s.max_tokens} tokens; "
                f"{s.passage_tokens} tokens of {source}, {report.term('teacher-forced')}.")
    with report.detail():
        report.row("Load", f"{s.load_requests} prompts of {s.load_prompt_tokens} tokens at once, "
                   f"{s.load_tokens} tokens each, in {s.load_kv_bytes // MIB} MiB of KV")
        report.row("max_model_len", s.max_model_len)
        report.row("vLLM", "its server, prefix caching off; EOS held off in the load, allowed "
                   "in the chat answers")
    if note:
        report.note(note)


def print_capacity(r: QuantizedKV) -> None:
    s = r.settings
    report.section(f"1. THE ARITHMETIC: {s.kv_cache_bytes // MIB} MIB OF KV")
    report.table(["format", "B/token", "blocks", "tokens", "users", "read", "vLLM"],
                 [(c.name, f"{c.bytes_per_token:,}", f"{c.pages:,}",
                   f"{c.pages * s.page_tokens:,}", f"{c.users(s)}",
                   "-" if c.mini_engine_pages is None else f"{c.mini_engine_pages:,}",
                   "-" if c.vllm_blocks is None else f"{c.vllm_blocks} of {c.load_pages}")
                  for c in r.capacity], [15, 9, 7, 8, 7, 7, 12])
    report.note(f"Users of {s.user_tokens} tokens. 'fp8 token' pays for its scales: 2 B each, "
                "for K and for V, in each head and layer.")
    with report.detail():
        report.note(f"Blocks of {s.page_tokens} tokens. 'read': the blocks an LLMEngine made of "
                    f"the same budget. 'vLLM': the blocks its server made of part 3's "
                    f"{s.load_kv_bytes // MIB} MiB, against those derived for it. fp8_e5m2 "
                    "costs what fp8 does.")


def print_quality(r: QuantizedKV) -> None:
    s = r.settings
    report.section("2. WHAT IT COSTS: AGAINST THE MODEL'S OWN DTYPE")
    report.table(["engine, format", "same", "first differs", "empty", "|dlogp|", "ppl"],
                 [(f"{SHORT[x.engine]} {x.name}", f"{x.num_identical}/{len(x.first_differences)}",
                   ",".join("-" if f is None else str(f) for f in x.first_differences),
                   x.num_empty, f"{x.mean_abs_logprob_change:.3f}",
                   f"{x.perplexity:.2f}") for x in r.quality], [20, 5, 18, 6, 8, 8])
    refs = ", ".join(f"{e} {p:.2f}" for e, p in r.reference_perplexity.items())
    report.note(f"same: greedy answers identical to the model dtype's; |dlogp|: the passage's "
                f"mean change of log p a token; ppl: its {report.term('perplexity')} "
                f"(model dtype: {refs}). A perplexity is called changed only past "
                f"{PERPLEXITY_BOUND:.0%} of the model dtype's.")
    report.row("Stuck in a loop", stuck_text(r))
    with report.detail():
        empty = ", ".join(f"{e} {n}" for e, n in r.reference_empty.items())
        report.note(f"first differs: the first token that differs, per prompt ('-': identical). "
                    f"Empty: EOS first (model dtype: {empty}). Stuck: the last 12 tokens a "
                    f"cycle of 1-4. Told apart: a mean over the passage's "
                    f"{s.passage_tokens - 1} tokens, beyond twice its standard error (and a "
                    "perplexity also past the bound); answers kept, by a sign test on the "
                    "prompts that one format kept and the other did not.")
        fine, coarse = (r.quality_of("mini_engine", "fp8 token"),
                        r.quality_of("mini_engine", "fp8 layer"))
        gap = change_gap(fine, coarse) if fine and coarse else None
        if gap:
            report.row("Scale per token - layer", f"|dlogp| {margin_text(gap)} a token")
    if r.vllm_skipped:
        report.note(r.vllm_skipped)


def print_throughput(r: QuantizedKV) -> None:
    s = r.settings
    report.section(f"3. WHAT IT BUYS: {s.load_requests} LONG PROMPTS IN "
                   f"{s.load_kv_bytes // MIB} MIB")
    report.table(["engine, format", "tokens", "running", "preempted", "tok/s", "TPOT ms"],
                 [(f"{SHORT[t.engine]} {t.name}", f"{t.capacity_tokens:,}", t.max_running,
                   "-" if t.num_preemptions is None else t.num_preemptions,
                   f"{t.tokens_per_s:.1f}",
                   "-" if t.mean_tpot_s is None else f"{1000 * t.mean_tpot_s:.1f}")
                  for t in r.throughput], [20, 8, 8, 10, 10, 9])
    report.note(f"tokens: what the budget holds; running: requests computed at once, at most; "
                f"{report.term('TPOT')}.")
    with report.detail():
        report.note(f"Prompts of {s.load_prompt_tokens} tokens of the text, {s.load_tokens} "
                    "tokens each answer, all sent at once. vLLM's running: sampled from "
                    "/metrics. tok/s: all the answers' tokens over the run. mini_engine wrote "
                    f"and read its 8-bit blocks in {s.kv_read}.")
    for engine in ("mini_engine", "vLLM"):
        if r.speedup(engine):
            report.row(f"{engine}, 8 bits", fmt.times_range(
                speedup_spread(r, engine), "tokens/s") if r.speedup_range(engine) else
                f"{fmt.times(r.speedup(engine))} tokens/s (one pass each)")


def speedup_spread(r: QuantizedKV, engine: str):
    """The speed-up with the ends of the passes in turns, as a Spread for fmt.times_range."""
    from common.measure import Spread
    low, high = r.speedup_range(engine)
    return Spread(r.speedup(engine), low, high, 2)


# --- the KEY INSIGHT: one claim a bullet, each sentence a whole template -------------------------
def capacity_line(r: QuantizedKV) -> str:
    base, layer, token = r.capacity[0], r.capacity_of("fp8 layer"), r.capacity_of("fp8 token")
    return (f"In {r.settings.kv_cache_bytes // MIB} MiB, fp8 holds "
            f"{fmt.times(layer.pages / base.pages)} {base.name}'s "
            f"{base.pages * r.settings.page_tokens:,} tokens with one scale a layer, and "
            f"{fmt.times(token.pages / base.pages)} with a scale for each token and head.")


def margin_text(gap: Shift) -> str:
    """'+0.032 +/- 0.020': a mean over the passage's tokens, with its margin."""
    return f"{gap.mean:+.3f} +/- {gap.margin:.3f}"


def change_sentence(fine: Quality, coarse: Quality) -> str:
    """The passage's mean |change| with a scale a token against one a layer, told apart or not."""
    gap = change_gap(fine, coarse)
    a, b = f"{fine.mean_abs_logprob_change:.3f}", f"{coarse.mean_abs_logprob_change:.3f}"
    if gap is None:
        return (f"In mini_engine, log p moved {a} a token with a scale per token, {b} with one a "
                "layer: not judged (no per-token changes saved).")
    if not gap.is_told_apart:
        return (f"In mini_engine, log p moved {a} a token with a scale per token, {b} with one a "
                f"layer: not told apart ({margin_text(gap)}).")
    return (f"In mini_engine, log p moved {a} a token with a scale per token, {b} with one a "
            "layer: told apart.")


def answers_sentence(fine: Quality, coarse: Quality, n: int) -> str:
    kept = f"{fine.num_identical} and {coarse.num_identical} of {n}"
    if not answers_told_apart(fine, coarse):
        return f"Answers kept: {kept}, not told apart."
    if fine.num_identical > coarse.num_identical:
        return f"Answers kept: {kept}, more with a scale per token, beyond chance."
    return f"Answers kept: {kept}, more with one a layer, beyond chance."


def stuck_text(r: QuantizedKV) -> str:
    """'mini fp8 token 1, vLLM fp8 layer 2': the answers stuck in a loop, each engine and format
    (the model dtype's too), or 'none'."""
    stuck = [f"{SHORT[e]} {r.capacity[0].name} {n}" for e, n in r.reference_stuck.items() if n]
    stuck += [f"{SHORT[x.engine]} {x.name} {x.num_stuck}" for x in r.quality if x.num_stuck]
    return ", ".join(stuck) if stuck else "none"


def scale_line(r: QuantizedKV) -> str | None:
    """mini_engine's fp8 with a scale a token against one a layer (vLLM's): the passage's change
    and the answers kept, each compared as far as the run tells them apart."""
    fine, coarse = (r.quality_of("mini_engine", "fp8 token"),
                    r.quality_of("mini_engine", "fp8 layer"))
    if not fine or not coarse:
        return None
    return (f"{change_sentence(fine, coarse)} "
            f"{answers_sentence(fine, coarse, r.settings.num_prompts)}")


def perplexity_verdict(q: Quality, reference: float) -> str:
    """Whether the passage's perplexity through this cache moved past the bound and the margin
    (record.perplexity_change): 'no change measured', 'a change of +29%', or 'not judged'
    where no per-token changes were saved."""
    change = perplexity_change(q, reference)
    if change is None:
        return "not judged"
    if change == 0.0:
        return "no change measured"
    return f"a change of {100 * change:+.0f}%"


def perplexity_text(q: Quality, reference: float) -> str:
    """'fp8 token 19.20, no change measured'."""
    return f"{q.name} {q.perplexity:.2f}, {perplexity_verdict(q, reference)}"


def perplexity_line(r: QuantizedKV) -> str | None:
    """The passage's perplexity in mini_engine, the model's dtype against each fp8 scale."""
    rows = [x for x in (r.quality_of("mini_engine", "fp8 token"),
                        r.quality_of("mini_engine", "fp8 layer")) if x]
    if not rows or "mini_engine" not in r.reference_perplexity:
        return None
    ref = r.reference_perplexity["mini_engine"]
    return (f"mini_engine's perplexity ({r.capacity[0].name} {ref:.2f}): "
            + "; ".join(perplexity_text(x, ref) for x in rows) + ".")


def vllm_line(r: QuantizedKV) -> str | None:
    """vLLM's fp8 (its scale a layer, 1.0) against its own model dtype."""
    theirs = r.quality_of("vLLM", "fp8 layer")
    if not theirs or "vLLM" not in r.reference_perplexity:
        return None
    base, ref = r.capacity[0].name, r.reference_perplexity["vLLM"]
    return (f"vLLM's fp8 kept {theirs.num_identical} of {r.settings.num_prompts} greedy "
            f"answers ({theirs.num_empty} empty, {r.reference_empty.get('vLLM', 0)} in {base}); "
            f"its perplexity went {ref:.2f} -> {theirs.perplexity:.2f}, "
            f"{perplexity_verdict(theirs, ref)}.")


def throughput_line(r: QuantizedKV) -> str | None:
    """mini_engine's 8-bit speed-up, judged by its passes in turns; vLLM's, one pass each."""
    mine = r.speedup("mini_engine")
    if mine is None:
        return None
    base, fp8 = [t for t in r.throughput if t.engine == "mini_engine"][:2]
    mib, n, b, gain = (r.settings.load_kv_bytes // MIB, base.max_running, fp8.max_running,
                       fmt.times(mine))
    ends = r.speedup_range("mini_engine")
    if ends is None:      # one pass each: no spread, and the machine drifts by a fifth
        said = (f"In {mib} MiB mini_engine ran {n} prompts at once in {base.name}, {b} in 8 "
                f"bits: {gain} tokens/s, one pass each, no spread.")
    elif ends[0] > 1:
        said = (f"In {mib} MiB mini_engine ran {n} prompts at once in {base.name}, {b} in 8 "
                f"bits: {gain} tokens/s ({ends[0]:.2f}-{ends[1]:.2f}), faster in every pairing.")
    elif ends[1] < 1:
        said = (f"In {mib} MiB mini_engine ran {n} prompts at once in {base.name}, {b} in 8 "
                f"bits: {gain} tokens/s ({ends[0]:.2f}-{ends[1]:.2f}), slower in every pairing.")
    else:
        said = (f"In {mib} MiB mini_engine ran {n} prompts at once in {base.name}, {b} in 8 "
                f"bits: {gain} tokens/s ({ends[0]:.2f}-{ends[1]:.2f}), not told apart from the "
                "same speed.")
    theirs = r.speedup("vLLM")
    return said if theirs is None else f"{said} vLLM: {fmt.times(theirs)}."


def insight(r: QuantizedKV) -> list[str]:
    return [line for line in (capacity_line(r), scale_line(r), perplexity_line(r), vllm_line(r),
                              throughput_line(r)) if line]


def print_report(r: QuantizedKV) -> None:
    print_capacity(r)
    print_quality(r)
    print_throughput(r)
    report.detail_hint()
    report.insight(insight(r))
