"""Task 14's report (task_14_quantized_kv.py prints it, in this order): what ran, the three parts
(the arithmetic, the quality, the throughput) and the KEY INSIGHT lines, each chosen from the
figures it states. Printing only, from the record (lessons/task_14/record.py)."""
from __future__ import annotations

from common import report
from lessons.task_14.record import (Quality, QuantizedKV, Shift, answers_told_apart,
                                    change_gap, shift)

MIB = 1 << 20
SHORT = {"mini_engine": "mini", "vLLM": "vLLM"}       # the tables' engine names


def print_run_info(model_choice, dtype, threads: int, s, source: str, note: str | None) -> None:
    report.title("Task 14: Half the Bytes a Token - a Quantized KV Cache")
    report.run_info(model_choice, dtype, threads,
                    Engines="mini_engine (kv_cache_dtype, kv_scale)"
                            + (" and vLLM (--kv-cache-dtype, its server, prefix caching off)"
                               if s.is_vllm_measured else "")
                            + f"; pages of {s.page_tokens} tokens, max_model_len "
                              f"{s.max_model_len}",
                    Quality=f"{s.num_prompts} chat prompts, greedy, at most {s.max_tokens} "
                            f"tokens (EOS allowed); {s.passage_tokens} tokens of {source}, "
                            "teacher-forced",
                    Load=f"{s.load_requests} prompts of {s.load_prompt_tokens} tokens at once, "
                         f"{s.load_tokens} tokens each (EOS held off), "
                         f"{s.load_kv_bytes // MIB} MiB of KV")
    if note:
        report.note(note)


def print_capacity(r: QuantizedKV) -> None:
    s = r.settings
    report.section(f"1. THE ARITHMETIC: {s.kv_cache_bytes // MIB} MIB OF KV")
    report.table(["format", "B/token", "pages", "tokens", "users", "read", "vLLM"],
                 [(c.name, f"{c.bytes_per_token:,}", f"{c.pages:,}",
                   f"{c.pages * s.page_tokens:,}", f"{c.users(s)}",
                   "-" if c.mini_engine_pages is None else f"{c.mini_engine_pages:,}",
                   "-" if c.vllm_blocks is None else f"{c.vllm_blocks} of {c.load_pages}")
                  for c in r.capacity], [15, 9, 7, 8, 7, 7, 12])
    report.note(f"Pages of {s.page_tokens} tokens; users of {s.user_tokens} tokens. 'read': the "
                f"pages an LLMEngine made of the same budget. 'vLLM': the blocks its server "
                f"made of part 3's {s.load_kv_bytes // MIB} MiB, against the pages derived for "
                "it. 'fp8 token' pays for its scales: 2 B each, one for K and one for V per "
                "head and layer; fp8_e5m2 costs what fp8 does.")


def print_quality(r: QuantizedKV) -> None:
    s = r.settings
    report.section("2. WHAT IT COSTS: AGAINST THE MODEL'S OWN DTYPE")
    report.table(["engine, format", "same", "first differs", "empty", "|dlogp|", "ppl"],
                 [(f"{SHORT[x.engine]} {x.name}", f"{x.num_identical}/{len(x.first_differences)}",
                   ",".join("-" if f is None else str(f) for f in x.first_differences),
                   x.num_empty, f"{x.mean_abs_logprob_change:.3f}",
                   f"{x.perplexity:.2f}") for x in r.quality], [20, 5, 18, 6, 8, 8])
    stuck = [f"{SHORT[e]} {r.capacity[0].name} {n}" for e, n in r.reference_stuck.items() if n]
    stuck += [f"{SHORT[x.engine]} {x.name} {x.num_stuck}" for x in r.quality if x.num_stuck]
    refs = ", ".join(f"{e} {p:.2f} ({r.reference_empty[e]} empty)"
                     for e, p in r.reference_perplexity.items())
    report.note(f"Greedy answers of {s.num_prompts} prompts, each against the same engine's "
                "with the model's dtype: identical, and where each first differs ('-': "
                "identical). Empty: EOS first. Stuck (the last 12 tokens a cycle of 1-4): "
                f"{', '.join(stuck) if stuck else 'none'}. "
                f"|dlogp|: the mean change of the passage's {s.passage_tokens - 1} "
                f"log-probabilities; ppl: its perplexity. The model's dtype: perplexity {refs}. "
                "Told apart (KEY INSIGHT): a mean over the passage's tokens, beyond twice its "
                "standard error; answers kept, by a sign test on the prompts that one format "
                "kept and the other did not.")
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
    report.note(f"Prompts of {s.load_prompt_tokens} tokens of the text, {s.load_tokens} tokens "
                "each answer, all sent at once. tokens: what the budget holds; running: "
                "requests computed at once, at most (vLLM's sampled from /metrics); tok/s: all "
                f"the answers' tokens over the run. mini_engine wrote and read its 8-bit pages "
                f"in {s.kv_read}.")
    for engine in ("mini_engine", "vLLM"):
        if r.speedup(engine):
            ends = r.speedup_range(engine)
            how = (f" ({ends[0]:.2f}-{ends[1]:.2f} from the ends of the passes in turns)"
                   if ends else " (one pass each)")
            report.row(f"{engine}, 8 bits", f"{r.speedup(engine):.2f}x tokens/s{how}")


def capacity_line(r: QuantizedKV) -> str:
    base, layer, token = r.capacity[0], r.capacity_of("fp8 layer"), r.capacity_of("fp8 token")
    return (f"In {r.settings.kv_cache_bytes // MIB} MiB the 8-bit cache holds "
            f"{layer.pages * r.settings.page_tokens:,} tokens with one scale a layer and "
            f"{token.pages * r.settings.page_tokens:,} with a scale a token and head, against "
            f"{base.pages * r.settings.page_tokens:,} in {base.name}: "
            f"{layer.pages / base.pages:.2f}x and {token.pages / base.pages:.2f}x, the scales "
            f"costing {token.bytes_per_token - layer.bytes_per_token} B of a token's "
            f"{token.bytes_per_token:,}")


def margin_text(gap: Shift) -> str:
    """'+0.032 +/- 0.020 a token': a mean over the passage's tokens, with its margin."""
    return f"{gap.mean:+.3f} +/- {gap.margin:.3f} a token"


def gap_text(gap: Shift | None, less: str, more: str) -> str:
    """A difference of means told apart (less or more) or not, its margin beside it."""
    if gap is None:
        return "no per-token changes saved to tell them apart"
    if not gap.is_told_apart:
        return f"a difference the passage cannot tell apart ({margin_text(gap)})"
    return f"{less if gap.mean < 0 else more} ({margin_text(gap)})"


def stuck_text(r: QuantizedKV, engine: str, rows) -> str:
    """'; answers stuck in a loop: 1 with a scale a token, 0 ...' where any of rows' answers or
    the model dtype's was stuck, else nothing. rows: (what to call it, Quality)."""
    counts = [(f"with {name}", q.num_stuck) for name, q in rows]
    counts.append((f"in {r.capacity[0].name}", r.reference_stuck.get(engine, 0)))
    if not any(n for _, n in counts):
        return ""
    return "; answers stuck in a loop: " + ", ".join(f"{n} {where}" for where, n in counts)


def scale_line(r: QuantizedKV) -> str | None:
    """mini_engine's fp8 with a scale a token against one a layer (vLLM's): the passage's change,
    the answers kept and any stuck, each compared as far as the run tells them apart."""
    n = r.settings.num_prompts
    fine, coarse = r.quality_of("mini_engine", "fp8 token"), r.quality_of("mini_engine",
                                                                          "fp8 layer")
    if not fine or not coarse:
        return None
    if answers_told_apart(fine, coarse):
        answers = ("more with a scale a token" if fine.num_identical > coarse.num_identical
                   else "more with one a layer") + ", beyond chance (a sign test)"
    else:
        answers = f"which {n} prompts cannot tell apart"
    return (f"In mini_engine's fp8, a scale a token against one a layer (1.0, as vLLM's): the "
            f"passage's log-probabilities changed by {fine.mean_abs_logprob_change:.3f} against "
            f"{coarse.mean_abs_logprob_change:.3f} on average, "
            + gap_text(change_gap(fine, coarse), "less with a scale a token",
                       "more with a scale a token")
            + f"; greedy answers kept: {fine.num_identical} and {coarse.num_identical} of {n}, "
            + answers
            + stuck_text(r, "mini_engine", [("a scale a token", fine),
                                            ("one a layer", coarse)]))


def perplexity_text(q: Quality) -> str:
    """'fp8 token 23.97, lower (+0.033 +/- 0.020 a token)': the passage's perplexity through
    this cache, and whether it moved beyond what the passage tells apart."""
    move = shift(q)
    if move is None:
        verdict = "no per-token changes saved to tell it apart"
    elif move.is_told_apart:   # log p up is perplexity down
        verdict = ("lower" if move.mean > 0 else "higher") + f" (log p {margin_text(move)})"
    else:
        verdict = f"the same as far as the passage tells (log p {margin_text(move)})"
    return f"{q.name} {q.perplexity:.2f}, {verdict}"


def perplexity_line(r: QuantizedKV) -> str | None:
    """The passage's perplexity in mini_engine, the model's dtype against each fp8 scale."""
    rows = [x for x in (r.quality_of("mini_engine", "fp8 token"),
                        r.quality_of("mini_engine", "fp8 layer")) if x]
    if not rows or "mini_engine" not in r.reference_perplexity:
        return None
    return (f"mini_engine's perplexity of the passage: {r.capacity[0].name} "
            f"{r.reference_perplexity['mini_engine']:.2f}; "
            + "; ".join(perplexity_text(x) for x in rows))


def vllm_line(r: QuantizedKV) -> str | None:
    """vLLM's fp8 (its scale a layer, 1.0) against its own model dtype."""
    theirs = r.quality_of("vLLM", "fp8 layer")
    if not theirs or "vLLM" not in r.reference_perplexity:
        return None
    base = r.capacity[0].name
    return (f"vLLM's fp8 (one scale a layer, 1.0): {theirs.num_identical} of "
            f"{r.settings.num_prompts} greedy answers kept, log-probabilities changed by "
            f"{theirs.mean_abs_logprob_change:.3f}, {theirs.num_empty} answers empty against "
            f"{r.reference_empty.get('vLLM', 0)} in {base}"
            + stuck_text(r, "vLLM", [("fp8", theirs)])
            + f"; perplexity {base} {r.reference_perplexity['vLLM']:.2f}, "
            + perplexity_text(theirs))


def throughput_line(r: QuantizedKV) -> str | None:
    mine = r.speedup("mini_engine")
    if mine is None:
        return None
    base, fp8 = [t for t in r.throughput if t.engine == "mini_engine"][:2]
    s = r.settings
    line = (f"With {s.load_requests} prompts of {s.load_prompt_tokens} tokens in "
            f"{s.load_kv_bytes // MIB} MiB, "
            f"mini_engine ran {base.max_running} at once in {base.name} and {fp8.max_running} "
            f"in 8 bits: {mine:.2f}x tokens/s")
    ends = r.speedup_range("mini_engine")
    if ends is None:      # one pass each: no spread, and the machine drifts by a fifth
        line += " (one pass each way, no spread to judge by)"
    elif ends[0] > 1 or ends[1] < 1:
        line += (f" ({ends[0]:.2f}-{ends[1]:.2f} from the passes in turns: "
                 f"{'faster' if ends[0] > 1 else 'slower'} in 8 bits, in every pairing)")
    else:
        line += (f" ({ends[0]:.2f}-{ends[1]:.2f} from the passes in turns: not told apart "
                 f"from the same speed)")
    theirs = r.speedup("vLLM")
    if theirs is not None:
        line += f"; vLLM {theirs:.2f}x (one pass each: a server a format)"
    return line


def insight(r: QuantizedKV) -> list[str]:
    return [line for line in (capacity_line(r), scale_line(r), perplexity_line(r), vllm_line(r),
                              throughput_line(r)) if line]


def print_report(r: QuantizedKV) -> None:
    print_capacity(r)
    print_quality(r)
    print_throughput(r)
    report.insight(insight(r))
