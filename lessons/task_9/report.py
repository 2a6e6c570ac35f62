"""Task 9's report (task_9_build_your_own_engine.py prints it once it has measured): the four
parts in their order, then the insight lines, each chosen from the figures it explains. Printing
only, from the run's record (lessons/task_9/record.py), read by attribute."""
from __future__ import annotations

import statistics

from common import kv, report
from lessons.task_9.profile import kernel_choice, print_kernels, print_phases, step_limit
from lessons.task_9.record import (Correctness, OwnEngine, PolicyRun, RunSettings, ratio_spread,
                                   times_text)


def print_header(model, dtype, threads: int, s: RunSettings) -> None:
    """The title and what runs: the model, its dtype, the threads, the engine's settings."""
    report.title("Task 9: Build the Engine Yourself")
    report.run_info(model, dtype, threads,
                    Engine=f"mini_engine, max_model_len={s.max_model_len}, KV {s.kv_bytes:,} B, "
                           f"pages of {s.page_size}, batch cap {s.max_batch}")


def print_report(run: OwnEngine) -> None:
    """The four parts in their order, then the insight chosen from them."""
    print_correctness(run.correctness)
    print_policies(run)
    print_phases(run.phases, run.machine)
    print_kernels(run.kernels)
    if run.vllm or run.transformers_static:     # part 4 ran (not --no-vllm)
        print_real_thing(run)
    report.insight(insights(run))


def print_correctness(c: Correctness) -> None:
    report.section(f"1. CORRECT: {c.num_prompts} prompts vs transformers (greedy, fp32)")
    report.row("Prompt lengths (tokens)", ", ".join(map(str, c.num_prompt_tokens)))
    report.row("New tokens each", f"{c.num_new_tokens} (EOS held off, as min_new_tokens)")
    report.row("Identical to transformers", f"{c.num_identical}/{c.num_prompts} "
                                            f"(every token, in {c.num_steps} engine steps)")
    for m in c.mismatches:
        report.note(f"DIFFERS: request {m.request} at new token {m.position}: engine "
                    f"{m.engine_token_id}, transformers {m.transformers_token_id}; top-2 logit "
                    f"margin there {m.top2_logit_margin:.2e}", indent=2)


def print_policies(run: OwnEngine) -> None:
    lengths, s, runs = run.workload_num_output_tokens, run.settings, list(run.policies.values())
    report.section(f"2. STATIC vs CONTINUOUS BATCHING ({len(lengths)} requests)")
    report.row("Output lengths (tokens)", f"mean {statistics.mean(lengths):.1f}, min "
               f"{min(lengths)}, max {max(lengths)} (exponential, seed {s.seed})")
    report.row("Batch cap, page size", f"{s.max_batch} requests, {s.page_size} tokens")
    headers = ["", *[r.label for r in runs]]
    widths = [23] + [42 // len(runs)] * len(runs)
    spreads = [r.tokens_per_s_spread for r in runs]
    rows = [("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
            ("  lowest-highest pass", *(f"{p.low:.1f}-{p.high:.1f}" for p in spreads)),
            ("Time (s)", *(f"{r.duration_s:.1f}" for r in runs)),
            ("Latency mean (s)", *(f"{r.mean_latency_s:.2f}" for r in runs)),
            ("Latency p95 (s)", *(f"{r.p95_latency_s:.2f}" for r in runs)),
            ("TTFT mean (s)", *(f"{r.mean_ttft_s:.2f}" for r in runs)),
            ("Steps", *(r.num_steps for r in runs)),
            ("Slot utilisation", *(f"{100 * r.slot_utilization_fraction:.0f}%" for r in runs)),
            ("Peak pages in use", *(r.peak_num_pages for r in runs)),
            ("  if contiguous", *(r.contiguous_num_pages for r in runs)),
            ("Preemptions", *(r.num_preemptions for r in runs))]
    report.table(headers, rows, widths)
    n = spreads[0].num_passes
    ways = len(runs) + bool(run.vllm)
    report.note((f"Each policy's median pass of {n}, by tokens/s" if n > 1 else "One pass each")
                + (f" (the ways took turns{' with vLLM' if run.vllm else ''})" if ways > 1 else "")
                + f"; slot utilisation = generated tokens / ({s.max_batch} slots x steps); "
                f"contiguous = rows x {kv.cdiv(s.max_model_len, s.page_size)} pages "
                f"({s.max_model_len} tokens)")
    if run.continuous_over_static_spread is not None:
        report.row("Continuous / static",
                   f"{times_text(run.continuous_over_static_spread, 'tokens/s')}, {rounds(run)}")


def print_real_thing(run: OwnEngine) -> None:
    report.section("4. AGAINST THE REAL THING (same workload, same cap)")
    ours, vllm, hf = run.best, run.vllm, run.transformers_static

    def spread(r) -> str:
        p = r.tokens_per_s_spread
        return f"{p.low:.1f}-{p.high:.1f}" if p.num_passes > 1 else "1 pass"
    rows = [(f"mini_engine, {ours.label}", f"{ours.tokens_per_s:.1f}", spread(ours),
             f"{ours.duration_s:.1f}")]
    if vllm:
        rows.append(("vLLM LLM.generate", f"{vllm.tokens_per_s:.1f}", spread(vllm),
                     f"{vllm.duration_s:.1f}"))
    if hf:
        rows.append(("transformers, static", f"{hf.tokens_per_s:.1f}", "1 pass",
                     f"{hf.duration_s:.1f}"))
    report.table(["Engine", "Tokens/s", "lowest-highest", "Time (s)"], rows,
                 widths=[26, 11, 16, 12])
    if vllm:
        report.row("This engine / vLLM",
                   f"{times_text(run.engine_over_vllm_spread, 'tokens/s')}, {rounds(run)}")
        report.row("vLLM ran", f"in this process, block size {vllm.block_size}, "
                               f"{vllm.num_blocks} blocks, max_num_seqs {run.settings.max_batch}, "
                               f"{vllm.num_threads} threads")


def rounds(run: OwnEngine) -> str:
    """'median of 3 rounds in turns' (the ratios' rounds), or 'one round'."""
    n = run.best.tokens_per_s_spread.num_passes
    return f"median of {n} rounds in turns" if n > 1 else "one round"


def insights(run: OwnEngine) -> list[str]:
    """Each line chosen from what this run measured; five at most, each result once."""
    lines = []
    n, ok = run.correctness.num_prompts, run.correctness.num_identical
    lines.append(f"Paged KV cache + batching from scratch: {ok}/{n} prompts token-identical to "
                 "transformers" + ("" if ok == n else " - the differing ones are listed above "
                                   "with their logit margin"))
    lines += batching_lines(run.policies)
    ours = run.best
    lines.append(f"Paging held at most {ours.peak_num_pages} pages where reserving max_model_len "
                 f"per running request would have held {ours.contiguous_num_pages}")
    if run.vllm:
        lines.append(vllm_line(run))
    lines.append(f"{step_limit(run.phases, run.machine)}. "
                 f"{kernel_choice(run.phases, run.machine, run.kernels)}")
    return lines


def vllm_line(run: OwnEngine) -> str:
    """The engine against vLLM, round by round: ahead, behind, or not told apart by the rounds
    (their range spans 1x)."""
    spread = run.engine_over_vllm_spread
    if spread.num_passes > 1 and spread.low <= 1 <= spread.high:
        verdict = "its rounds fell on both sides of 1x: the two are not told apart here"
    else:
        verdict = "ahead of vLLM" if spread.median >= 1 else "behind vLLM"
        verdict += " in every round" if spread.num_passes > 1 else " in its one round"
    ratio = times_text(spread, "vLLM's tokens/s")
    return f"This engine ran at {ratio} on the same workload ({rounds(run)}): {verdict}"


def batching_lines(runs: dict[str, PolicyRun]) -> list[str]:
    """What continuous batching gained over static, split into padding removed and slots
    refilled (where all three ran), each ratio the median of the rounds: one line."""
    if "static" not in runs or "continuous" not in runs:
        return []
    static, cont = runs["static"], runs["continuous"]
    ratio = ratio_spread(cont, static)
    idle = 100 * (1 - static.slot_utilization_fraction)
    verb = "made" if ratio.median >= 1 else "made only"
    times = times_text(ratio, "static's tokens/s")
    line = (f"Continuous batching {verb} {times}: static kept "
            f"{idle:.0f}% of its slot-steps idle or padding, continuous "
            f"{100 * (1 - cont.slot_utilization_fraction):.0f}%")
    if "static no-pad" in runs:
        nopad = runs["static no-pad"]
        line += (f"; of that, {ratio_spread(nopad, static).median:.2f}x came from not computing "
                 f"finished rows and {ratio_spread(cont, nopad).median:.2f}x from refilling "
                 "their slots at the next step")
    return [line]
