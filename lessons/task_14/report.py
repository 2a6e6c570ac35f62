"""Task 14's report (task_14_quantized_kv.py prints it, in this order): what ran, the three parts
(the arithmetic, the quality, the throughput) and the KEY INSIGHT lines, each chosen from the
figures it states. Printing only, from the record (lessons/task_14/record.py)."""
from __future__ import annotations

from common import report
from lessons.task_14.record import QuantizedKV

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
    stuck = [f"{SHORT[x.engine]} {x.name} {x.num_stuck}" for x in r.quality if x.num_stuck]
    refs = ", ".join(f"{e} {p:.2f} ({r.reference_empty[e]} empty)"
                     for e, p in r.reference_perplexity.items())
    report.note(f"Greedy answers of {s.num_prompts} prompts, each against the same engine's "
                "with the model's dtype: identical, and where each first differs ('-': "
                "identical). Empty: EOS first. Stuck (the last 12 tokens a cycle of 1-4): "
                f"{', '.join(stuck) if stuck else 'none'}. "
                f"|dlogp|: the mean change of the passage's {s.passage_tokens - 1} "
                f"log-probabilities; ppl: its perplexity. The model's dtype: perplexity {refs}.")
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
            report.row(f"{engine}, 8 bits", f"{r.speedup(engine):.2f}x tokens/s")


def capacity_line(r: QuantizedKV) -> str:
    base, layer, token = r.capacity[0], r.capacity_of("fp8 layer"), r.capacity_of("fp8 token")
    return (f"In {r.settings.kv_cache_bytes // MIB} MiB the 8-bit cache holds "
            f"{layer.pages * r.settings.page_tokens:,} tokens with one scale a layer and "
            f"{token.pages * r.settings.page_tokens:,} with a scale a token and head, against "
            f"{base.pages * r.settings.page_tokens:,} in {base.name}: "
            f"{layer.pages / base.pages:.2f}x and {token.pages / base.pages:.2f}x, the scales "
            f"costing {token.bytes_per_token - layer.bytes_per_token} B of a token's "
            f"{token.bytes_per_token:,}")


def quality_line(r: QuantizedKV) -> str | None:
    """What the finer scale changed in mini_engine, against vLLM's per-layer scale."""
    n = r.settings.num_prompts
    fine, coarse = r.quality_of("mini_engine", "fp8 token"), r.quality_of("mini_engine",
                                                                          "fp8 layer")
    if not fine or not coarse:
        return None
    better = (round(fine.mean_abs_logprob_change, 3)             # as printed
              < round(coarse.mean_abs_logprob_change, 3))
    line = (f"In mini_engine, fp8 with a scale a token kept {fine.num_identical} of {n} greedy "
            f"answers and changed the passage's log-probabilities by "
            f"{fine.mean_abs_logprob_change:.3f} on average; with one scale a layer, 1.0 as "
            f"vLLM's, {coarse.num_identical} of {n} and {coarse.mean_abs_logprob_change:.3f}: "
            + ("the finer scale was better" if better else "the finer scale was not better"))
    theirs = r.quality_of("vLLM", "fp8 layer")
    if theirs:
        line += (f". vLLM's fp8 kept {theirs.num_identical} of {n}, "
                 f"{theirs.mean_abs_logprob_change:.3f}, {theirs.num_empty} empty")
    return line


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
    theirs = r.speedup("vLLM")
    if theirs is not None:
        line += f"; vLLM {theirs:.2f}x" + (", slower in 8 bits on this CPU"
                                            if round(theirs, 2) < 1 else "")
    return line


def insight(r: QuantizedKV) -> list[str]:
    return [line for line in (capacity_line(r), quality_line(r), throughput_line(r)) if line]


def print_report(r: QuantizedKV) -> None:
    print_capacity(r)
    print_quality(r)
    print_throughput(r)
    report.insight(insight(r))
