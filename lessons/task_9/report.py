"""Task 9's report (task_9_build_your_own_engine.py prints it once it has measured): the four
parts in their order, then the insight lines, each chosen from the figures it explains. Printing
only, from the run's record (lessons/task_9/record.py), read by attribute."""
from __future__ import annotations

import statistics

from common import fmt, kv, report
from lessons.task_9.profile import kernel_choice, print_kernels, print_phases, step_limit
from lessons.task_9.record import (Correctness, OwnEngine, PolicyRun, RunSettings,
                                   median_round_split, ratio_spread)


def print_header(model, dtype, threads: int, s: RunSettings) -> None:
    """The title and what runs: the model, its dtype, the threads, the engine's settings."""
    report.title("Task 9: Build the Engine Yourself")
    report.run_info(model, dtype, threads,
                    Engine=f"mini_engine, max_model_len={s.max_model_len}, batch cap "
                           f"{s.max_batch}, KV cache {s.kv_bytes:,} B",
                    **{"KV block": f"one {report.term('block')} holds {s.page_size} tokens"})


def print_report(run: OwnEngine) -> None:
    """The four parts in their order, then the insight chosen from them."""
    print_correctness(run.correctness)
    print_policies(run)
    print_phases(run.phases, run.machine)
    print_kernels(run.kernels)
    with report.detail():
        report.note(kernel_choice(run.phases, run.machine, run.kernels) + ".")
    if run.vllm or run.transformers_static:     # part 4 ran (not --no-vllm)
        print_real_thing(run)
    report.detail_hint()
    report.insight(insights(run))


def print_correctness(c: Correctness) -> None:
    report.section(f"1. CORRECT: {c.num_prompts} prompts vs transformers (greedy, fp32)")
    with report.detail():
        report.row("Prompt lengths (tokens)", ", ".join(map(str, c.num_prompt_tokens)))
    report.row("New tokens each", f"{c.num_new_tokens} (EOS held off)")
    report.row("Identical to transformers", f"{c.num_identical}/{c.num_prompts} (every token, "
                                            f"{c.num_steps} steps)")
    for m in c.mismatches:
        report.note(f"DIFFERS: request {m.request} at new token {m.position}: engine "
                    f"{m.engine_token_id}, transformers {m.transformers_token_id}; top-2 logit "
                    f"margin there {m.top2_logit_margin:.2e}", indent=2)


def print_policies(run: OwnEngine) -> None:
    lengths, s, runs = run.workload_num_output_tokens, run.settings, list(run.policies.values())
    report.section(f"2. STATIC vs CONTINUOUS BATCHING ({len(lengths)} requests)")
    report.note(f"Compared: {report.term('static batching')}, against "
                f"{report.term('continuous batching')}.")
    report.row("Output lengths (tokens)", f"mean {statistics.mean(lengths):.1f}, "
               f"{min(lengths)}-{max(lengths)}, seed {s.seed}")
    headers = ["", *[r.label for r in runs]]
    widths = [23] + [42 // len(runs)] * len(runs)
    spreads = [r.tokens_per_s_spread for r in runs]
    report.table(headers, [
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
        ("  lowest-highest pass", *(f"{p.low:.1f}-{p.high:.1f}" for p in spreads)),
        ("Steps", *(r.num_steps for r in runs)),
        ("Slot utilisation", *(fmt.pct(r.slot_utilization_fraction) for r in runs)),
        ("Peak blocks in use", *(r.peak_num_pages for r in runs)),
        ("  if contiguous", *(r.contiguous_num_pages for r in runs))], widths)
    n = spreads[0].num_passes
    took_turns = (" (the ways took turns with vLLM)" if run.vllm else
                  " (the ways took turns)" if len(runs) > 1 else "")
    median = f"Each policy's median pass of {n}, by tokens/s" if n > 1 else "One pass each"
    report.note(f"{median}{took_turns}; slot utilisation = generated tokens / ({s.max_batch} "
                f"slots x steps); contiguous = rows x {kv.cdiv(s.max_model_len, s.page_size)} "
                f"blocks ({s.max_model_len} tokens)")
    with report.detail():
        print()
        report.table(["Latency and waiting", *[r.label for r in runs]], [
            ("Time (s)", *(fmt.secs(r.duration_s, 1) for r in runs)),
            ("Latency mean (s)", *(fmt.secs(r.mean_latency_s) for r in runs)),
            ("Latency, 95th pct (s)", *(fmt.secs(r.p95_latency_s) for r in runs)),
            ("First token, mean (s)", *(fmt.secs(r.mean_ttft_s) for r in runs)),
            ("Requests preempted", *(r.num_preemptions for r in runs))], widths)
    if run.continuous_over_static_spread is not None:
        report.row("Continuous / static",
                   f"{fmt.times_range(run.continuous_over_static_spread, 'tokens/s')}, "
                   f"{rounds(run)}")


def print_real_thing(run: OwnEngine) -> None:
    report.section("4. AGAINST THE REAL THING (same workload, same cap)")
    ours, vllm, hf = run.best, run.vllm, run.transformers_static

    def spread(r) -> str:
        p = r.tokens_per_s_spread
        return f"{p.low:.1f}-{p.high:.1f}" if p.num_passes > 1 else "1 pass"
    rows = [(f"mini_engine, {ours.label}", f"{ours.tokens_per_s:.1f}", spread(ours),
             fmt.secs(ours.duration_s, 1))]
    if vllm:
        rows.append(("vLLM LLM.generate", f"{vllm.tokens_per_s:.1f}", spread(vllm),
                     fmt.secs(vllm.duration_s, 1)))
    if hf:
        rows.append(("transformers, static", f"{hf.tokens_per_s:.1f}", "1 pass",
                     fmt.secs(hf.duration_s, 1)))
    report.table(["Engine", "Tokens/s", "lowest-highest", "Time (s)"], rows,
                 widths=[26, 11, 16, 12])
    if vllm:
        report.row("This engine / vLLM",
                   f"{fmt.times_range(run.engine_over_vllm_spread, 'tokens/s')}, {rounds(run)}")
        with report.detail():
            report.row("vLLM ran", f"in this process, block size {vllm.block_size}, "
                                   f"{vllm.num_blocks} blocks, max_num_seqs "
                                   f"{run.settings.max_batch}, {vllm.num_threads} threads")


def rounds(run: OwnEngine) -> str:
    """'median of 3 rounds in turns' (the ratios' rounds), or 'one round'."""
    n = run.best.tokens_per_s_spread.num_passes
    return f"median of {n} rounds in turns" if n > 1 else "one round"


def insights(run: OwnEngine) -> list[str]:
    """Each line chosen from what this run measured; five at most, each result once."""
    return [correct_line(run.correctness), *batching_lines(run.policies), paging_line(run),
            *([vllm_line(run)] if run.vllm else []), step_limit(run.phases, run.machine) + "."]


def correct_line(c: Correctness) -> str:
    if c.num_identical == c.num_prompts:
        return f"The engine matched transformers token for token on {c.num_prompts}/" \
               f"{c.num_prompts} prompts."
    return f"Only {c.num_identical}/{c.num_prompts} prompts matched transformers token for token."


def paging_line(run: OwnEngine) -> str:
    """The blocks the paged cache held against reserving max_model_len a request, and whether
    that reservation would have fitted the pool (then the batch cap, not the cache, bound)."""
    ours, pool = run.best, run.num_kv_blocks
    peak, contiguous = ours.peak_num_pages, ours.contiguous_num_pages
    if pool is None:
        return (f"Paging held at most {peak} blocks; reserving max_model_len for each running "
                f"request would hold {contiguous}.")
    if contiguous <= pool:
        return (f"Paging held at most {peak} blocks; reserving max_model_len for each running "
                f"request would hold {contiguous}. Both fit the pool of {pool}: the batch cap, "
                "not the KV cache, bound the batch.")
    return (f"Paging held at most {peak} blocks; reserving max_model_len for each running "
            f"request would hold {contiguous}, more than the pool of {pool}: paging let the "
            "batch grow.")


def vllm_line(run: OwnEngine) -> str:
    """The engine against vLLM, round by round: ahead, behind, or not told apart by the rounds
    (their range spans 1x)."""
    spread = run.engine_over_vllm_spread
    ratio = fmt.times_range(spread, "vLLM's tokens/s")
    n = spread.num_passes
    if n > 1 and spread.low <= 1 <= spread.high:
        return f"This engine ran at {ratio}, its {n} rounds on both sides of 1x: not told apart."
    if n > 1 and spread.median >= 1:
        return f"This engine ran at {ratio}, ahead of vLLM in every round of {n}."
    if n > 1:
        return f"This engine ran at {ratio}, behind vLLM in every round of {n}."
    if spread.median >= 1:
        return f"This engine ran at {ratio}, ahead of vLLM in its one round."
    return f"This engine ran at {ratio}, behind vLLM in its one round."


def batching_lines(runs: dict[str, PolicyRun]) -> list[str]:
    """What continuous batching gained over static (the median round, with the rounds' range),
    and, where static without padding ran too and the rounds tell the two apart, that same
    round split in its two factors: one line."""
    if "static" not in runs or "continuous" not in runs:
        return []
    ratio = ratio_spread(runs["continuous"], runs["static"])
    times = fmt.times_range(ratio, "static's tokens/s")
    if ratio.num_passes > 1 and ratio.low <= 1 <= ratio.high:   # no gain to split
        return [f"Continuous batching made {times}, its rounds on both sides of 1x: the two "
                "are not told apart here."]
    if ratio.median >= 1:
        line = f"Continuous batching made {times}."
    else:
        line = f"Continuous batching made only {times}."
    split = median_round_split(runs)
    if split is None:
        return [line]
    return [f"{line} Its median round: {fmt.times(split.padding)} from dropping finished rows, "
            f"times {fmt.times(split.refill)} from refilling their slots."]
