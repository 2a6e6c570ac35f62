"""Task 10's report (task_10_prefix_caching.py prints it, in this order): what ran, then the
four parts (correct, the blocks, mini_engine measured, vLLM) and the KEY INSIGHT lines. Printing
only: the script measures, these print its record (lessons/task_10/record.py), read by attribute,
every pair of runs in the record's order, cache off then cache on."""
from __future__ import annotations

from common import fmt, report, settings
from lessons.task_10.record import Correctness, EngineRun, PrefixCaching, Settings, WorkloadShape

WIDTHS = [33, 16, 16]   # the tables' columns: what, cache off, cache on


def print_run_info(model_choice, dtype, threads: int, s: Settings, w: WorkloadShape) -> None:
    long = ("" if s.max_model_len == settings.MAX_MODEL_LEN
            else " (the lab's 128 cannot hold it all)")
    report.title("Task 10: Share the Prefix - Prefix Caching")
    report.run_info(model_choice, dtype, threads,
                    Engine=f"mini_engine and vLLM, max_model_len={s.max_model_len}{long}, "
                           f"batch cap {s.max_num_seqs}, greedy",
                    **{"KV block": f"one {report.term('block')} holds {s.page_size_tokens} "
                                   "tokens"},
                    Workload=f"{s.num_requests} chat requests: a system prompt of "
                             f"{s.num_system_tokens} tokens + a question ({w.min_prompt_tokens}-"
                             f"{w.max_prompt_tokens} tokens, {w.num_shared_tokens} shared), "
                             f"{s.num_output_tokens} new tokens each")
    with report.detail():
        report.row("KV cache, kernels", f"{s.kv_cache_bytes:,} B; mini_engine's kernels "
                                        f"{s.kernels}")
    report.note(f"Measured: {report.term('prefix caching')}, off and then on.")


def print_report(res: PrefixCaching) -> None:
    """The four parts and the insights, from the record."""
    print_correct(res.correct)
    print_pages(*res.mini_engine)
    print_measured(res)
    if res.vllm:
        print_vllm(res)
    report.detail_hint()
    report.insight(insights(res))


def print_correct(c: Correctness) -> None:
    report.section("1. CORRECT: the cache changes no token (fp32, greedy)")
    report.row("Cache on vs off", f"{c.num_identical}/{c.num_requests} requests identical, "
                                  f"{c.cached_prompt_tokens:,} of {c.prompt_tokens:,} prompt "
                                  "tokens cached")
    report.row("Against transformers", f"{c.num_identical_hf}/{c.num_checked_hf} identical "
                                       "(cache on)")


def print_pages(off: EngineRun, on: EngineRun) -> None:
    peak = on.peak
    report.section(f"2. THE BLOCKS (cache on, step {peak.step}, most blocks held)")
    shared = peak.shared_pages
    for seq_id, table in peak.page_tables.items():
        report.row(f"Request {seq_id + 1} block table",
                   " ".join(f"{p}*" if p in shared else str(p) for p in table))
    counts = ", ".join(f"block {p}: {peak.ref_counts[p]}" for p in sorted(shared))
    report.row("Ref counts (* shared)", counts or "none")
    report.row("Blocks held then", f"{peak.num_pages_held} for {peak.num_running} running "
                                   f"requests, {peak.num_pages_unshared} if each held its own")
    report.row("Peak blocks in use", f"{on.num_pages_peak} with the cache, {off.num_pages_peak} "
                                     "without")


def print_measured(res: PrefixCaching) -> None:
    runs, control = res.mini_engine, res.control
    report.section("3. MEASURED IN mini_engine (cache off vs on)")
    report.note(f"{report.term('TTFT')}: from adding every request at once to each one's first "
                "token.")
    report.table(["Chat workload", *(r.label for r in runs)], [
        ("Prompt tokens computed", *(f"{r.computed_prompt_tokens:,}" for r in runs)),
        ("  taken from the cache", *(f"{r.cached_prompt_tokens:,}" for r in runs)),
        ("Hit rate (prompt tokens)", *(fmt.pct(r.hit_fraction, 1) for r in runs)),
        ("TTFT mean (s)", *(fmt.secs(r.mean_ttft_s) for r in runs)),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
        ("Peak blocks in use", *(r.num_pages_peak for r in runs)),
        ("Outputs as cache off", "",
         f"{res.num_identical_in_dtype}/{res.settings.num_requests}")], WIDTHS)
    print()
    report.table(["Control (no block shared)", *(r.label for r in control)], [
        ("Hit rate (prompt tokens)", *(fmt.pct(r.hit_fraction, 1) for r in control)),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in control)),
        ("Time (s)", *(fmt.secs(r.duration_s) for r in control)),
        ("  of it scheduling (ms)", *(f"{1000 * r.bookkeeping_s:.0f}" for r in control))], WIDTHS)
    report.note("Scheduling: admission, the cache's look-ups and block hashes, the block tables.")
    with report.detail():
        report.table(["Chat workload, more", *(r.label for r in runs)], [
            ("TTFT, 95th percentile (s)", *(fmt.secs(r.p95_ttft_s) for r in runs)),
            ("Time (s)", *(fmt.secs(r.duration_s) for r in runs))], WIDTHS)
        report.table(["Control, more", *(r.label for r in control)], [
            ("TTFT mean (s)", *(fmt.secs(r.mean_ttft_s) for r in control))], WIDTHS)
        spreads = [r for r in (*runs, *control) if r.tokens_per_s_spread]
        if spreads:
            passes = spreads[0].tokens_per_s_spread.num_passes
            report.note(f"Each run is the median pass of {passes}, cache off and on taking "
                        "turns; tokens/s and mean TTFT of every pass (lowest-highest): "
                        + "; ".join(
                            f"{name} {r.label} {r.tokens_per_s_spread.low:.1f}-"
                            f"{r.tokens_per_s_spread.high:.1f} tok/s, {r.ttft_spread.low:.2f}-"
                            f"{r.ttft_spread.high:.2f} s"
                            for name, group in (("chat", runs), ("control", control))
                            for r in group if r.tokens_per_s_spread))


def print_vllm(res: PrefixCaching) -> None:
    runs, w, page = res.vllm, res.workload, res.settings.page_size_tokens
    report.section("4. vLLM: THE SAME WORKLOAD THROUGH THE LAB'S SERVER")
    report.table(["Streamed, all at once", *(r.label for r in runs)], [
        ("TTFT mean (s)", *(fmt.secs(r.level.mean_ttft_s) for r in runs)),
        ("Tokens/s", *(f"{r.level.tokens_per_s:.1f}" for r in runs)),
        ("Prefix cache hits (tokens)", *(f"{r.prefix_cache_hit_tokens:,}" for r in runs)),
        ("  of queries (tokens)", *(f"{r.prefix_cache_query_tokens:,}" for r in runs)),
        ("Hit rate (/metrics)", *(fmt.pct(r.hit_fraction, 1) for r in runs)),
        ("Succeeded", *(f"{r.level.num_ok}/{r.level.num_users}" for r in runs))], WIDTHS)
    whole, n = w.whole_page_tokens(page), res.settings.num_requests
    report.note(f"Why under 100%: every prompt starts with the same {w.num_shared_tokens} tokens, "
                f"{whole // page} whole blocks of {page} ({whole} tokens); only whole blocks are "
                f"cached, and the first request computes them, so at most {n - 1} x {whole} = "
                f"{(n - 1) * whole:,} of {w.num_prompt_tokens:,} prompt tokens can hit "
                f"({100 * (n - 1) * whole / w.num_prompt_tokens:.1f}%).")
    report.note("Offline LLM.generate, RequestOutput.num_cached_tokens: " + "; ".join(
        f"{label} {r.num_cached_tokens} of {r.prompt_tokens}" for label, r in res.offline.items())
        + ". A prompt found whole in the cache still computes its last block: its last token's "
          "logits pick the next token.")
    with report.detail():
        report.table(["Streamed, more", *(r.label for r in runs)], [
            ("TTFT, 95th percentile (s)", *(fmt.secs(r.level.p95_ttft_s) for r in runs))],
            WIDTHS)
        report.note("One pass each: a second pass would find the first one's blocks cached.")


def insights(res: PrefixCaching) -> list[str]:
    """Each line chosen from the figures it states: a bug or rounding, noise or the cache."""
    (off, on), c = res.mini_engine, res.correct
    n, dtype = c.num_requests, res.header.dtype
    same = res.num_identical_in_dtype
    if c.num_identical < n:
        lines = [f"{n - c.num_identical} of {n} requests differ with the cache in fp32: a bug."]
    elif same < n:                           # rounding only where fp32 clears the cache
        lines = [f"The cache changed no token in fp32 ({n}/{n}); in {dtype} {same}/{n} matched: "
                 "the rest is rounding of K/V computed in another batch."]
    else:
        lines = [f"The cache changed no token: {n}/{n} requests identical in fp32."]
    fewer = fmt.pct(1 - on.computed_prompt_tokens / off.computed_prompt_tokens)
    lines.append(f"Sharing the system prompt's blocks cut the prompt tokens computed by {fewer}. "
                 + ttft_sentence(off, on))
    lines.append(f"At the peak the cache held {on.num_pages_peak} blocks against "
                 f"{off.num_pages_peak} without it: the same KV budget would hold "
                 f"{off.num_pages_peak / on.num_pages_peak:.1f}x these requests.")
    lines.append(control_line(*res.control))
    if res.vllm and res.vllm[1].hit_fraction is not None:
        off_v, on_v = res.vllm
        lines.append(f"vLLM took {fmt.pct(on_v.hit_fraction)} of the prompt tokens from its "
                     f"cache; its mean TTFT went from {fmt.secs(off_v.level.mean_ttft_s)} to "
                     f"{fmt.secs(on_v.level.mean_ttft_s)} s, in one pass each.")
    return lines


def ttft_sentence(off: EngineRun, on: EngineRun) -> str:
    """mini_engine's mean TTFT, cache off then on: lower or higher where every pass of one is
    below every pass of the other (their ranges apart), else not told apart; one pass each
    tells nothing apart."""
    was, now = fmt.secs(off.mean_ttft_s), fmt.secs(on.mean_ttft_s)
    speed = fmt.times(on.tokens_per_s / off.tokens_per_s)
    if off.ttft_spread is None or on.ttft_spread is None:
        return (f"Mean TTFT went from {was} to {now} s, with {speed} the tokens/s, in one run "
                "each: too few to tell from noise.")
    if on.ttft_spread.overlaps(off.ttft_spread):
        return (f"Mean TTFT went from {was} to {now} s, but the passes overlap: not told "
                "apart here.")
    if on.mean_ttft_s < off.mean_ttft_s:
        return f"Mean TTFT fell from {was} to {now} s in every pass, with {speed} the tokens/s."
    return f"Mean TTFT rose from {was} to {now} s in every pass, with {speed} the tokens/s."


def control_line(c_off: EngineRun, c_on: EngineRun) -> str:
    """The control (nothing hits): the cache on against off, called noise only where the
    bookkeeping's gap is small and the passes (or, one run each, the gap) say so."""
    change = f"{100 * (c_on.tokens_per_s / c_off.tokens_per_s - 1):+.1f}%"
    small = abs(c_on.bookkeeping_s - c_off.bookkeeping_s) < 0.01 * c_on.duration_s
    if c_on.tokens_per_s_spread and c_off.tokens_per_s_spread:   # passes: their ranges decide
        how = f"median of {c_on.tokens_per_s_spread.num_passes} passes each"
        is_noise = small and c_on.tokens_per_s_spread.overlaps(c_off.tokens_per_s_spread)
    else:                                # one run each: the gap against the bookkeeping's
        how = "one run each"
        is_noise = small and 0.01 * c_on.duration_s < abs(c_on.duration_s - c_off.duration_s)
    on_s, off_s = f"{c_on.tokens_per_s:.1f}", f"{c_off.tokens_per_s:.1f}"
    kept, kept_off = f"{1000 * c_on.bookkeeping_s:.0f}", f"{1000 * c_off.bookkeeping_s:.0f}"
    if is_noise:
        return (f"When nothing hits, the cache on made {on_s} tokens/s against {off_s} "
                f"({change}, {how}): noise, as its bookkeeping took {kept} ms of "
                f"{c_on.duration_s:.1f} s ({kept_off} ms off).")
    if small:
        return (f"When nothing hits, the cache on made {on_s} tokens/s against {off_s} "
                f"({change}, {how}), a gap its bookkeeping ({kept} ms of "
                f"{c_on.duration_s:.1f} s, {kept_off} ms off) does not explain.")
    return (f"When nothing hits, the cache on made {on_s} tokens/s against {off_s} ({change}, "
            f"{how}); its bookkeeping took {kept} ms of {c_on.duration_s:.1f} s ({kept_off} ms "
            "off): the cache's own cost.")
