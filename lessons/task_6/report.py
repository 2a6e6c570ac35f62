"""Task 6's report (task_6_multi_user_load.py prints it, in this order): the levels, one request
alone measured two ways and the scaling factor, the largest group one after another, the KEY
INSIGHT. Printing only: the script measures, these print what it measured (common.load's
LoadLevel, the record's Alone)."""
from __future__ import annotations

from common import fmt, load, measure, report
from lessons.task_6.record import (SEQUENTIAL, Alone, computed_in_line_ttft_s, num_failed_of,
                                   scaling_range)

# How the insight reads the figures: throughput "scales" when the peak level makes at least
# SCALES_AT times the tokens/s of one request alone; latency "rose" when the largest level's mean
# latency is over LATENCY_ROSE_AT times one request alone's.
SCALES_AT = 1.5
LATENCY_ROSE_AT = 1.1
# Requests were batched, not served in line, when their mean time to first token is under this
# share of what the same requests got one after another: half way from none of the wait to all.
IN_LINE_AT = 0.5


def print_levels(levels: list[load.LoadLevel], spreads: list[measure.Spread] = ()) -> None:
    report.section("LOAD TEST RESULTS")
    report.table(["Users", "Tokens", "Time(s)", "Tok/s", "Avg(s)", "p50(s)", "p95(s)", "TTFT(s)",
                  "OK"],
                 [(lv.num_users, lv.num_output_tokens, fmt.secs(lv.duration_s),
                   f"{lv.tokens_per_s:.1f}", fmt.secs(lv.mean_latency_s),
                   fmt.secs(lv.p50_latency_s), fmt.secs(lv.p95_latency_s),
                   fmt.secs(lv.mean_ttft_s), f"{lv.num_ok}/{lv.num_users}")
                  for lv in levels],
                 widths=[6, 7, 8, 8, 7, 7, 7, 8, 7], align_left=())
    report.note(f"Avg: a request's mean end-to-end latency; {report.term('p50 / p95')}; "
                f"{report.term('TTFT')}, the mean; '-': no request of the level succeeded.")
    if spreads and spreads[0].num_passes > 1:
        report.note(f"Each level's median pass of {spreads[0].num_passes}.")
        with report.detail():
            report.note("Tok/s of every pass (lowest-highest): " + ", ".join(
                f"{lv.num_users} user{'s' * (lv.num_users > 1)} {s.low:.1f}-{s.high:.1f}"
                for lv, s in zip(levels, spreads)))
    for lv in levels:
        for error in lv.errors:
            report.note(f"{lv.num_users} users, failed: {error}", indent=2)


def print_alone(alone: Alone, sequential: load.LoadLevel | None, one_user: load.LoadLevel
                ) -> None:
    """The two figures of one request alone (twins), their verdict, and which one the baseline
    is; the engine core's own step beside them, behind --detail."""
    report.note("One request alone, measured two ways (tok/s of the request):")
    report.note(f"the 1-user level: {alone.level.text()}", indent=2)
    if alone.sequential is None or sequential is None:
        return
    report.note(f"the {sequential.num_users} requests one after another: "
                f"{alone.sequential.text(what='requests')}", indent=2)
    report.note(f"{fmt.twins(alone.level, alone.sequential, 'tok/s')}.", indent=2)
    level_n, seq_n = alone.level.num_passes, alone.sequential.num_passes
    if alone.used == SEQUENTIAL:
        report.note(f"The baseline is the sequential requests, the one of more passes "
                    f"({seq_n} against {level_n}).", indent=2)
    elif alone.agree:
        report.note("The baseline is the 1-user level, as they agree.", indent=2)
    else:
        report.note(f"The baseline is the 1-user level, of {level_n} passes against "
                    f"{seq_n}.", indent=2)
    if one_user.engine_itl_s and sequential.engine_itl_s:
        with report.detail():
            itl = fmt.twins(1000 * one_user.engine_itl_s, 1000 * sequential.engine_itl_s, "ms")
            report.note(f"The engine core's inter-token latency, the same two ways: {itl}.",
                        indent=2)


def print_scaling(levels: list[load.LoadLevel], spreads: list[measure.Spread] = (),
                  alone: Alone | None = None, sequential: load.LoadLevel | None = None
                  ) -> float:
    """Peak throughput over one request alone (alone's baseline, else the first level's), and
    each level's speed per user; returns the scaling factor (0 when the baseline made no
    tokens)."""
    base, peak = levels[0], max(levels, key=lambda lv: lv.tokens_per_s)
    base_tps = alone.tokens_per_s if alone else base.tokens_per_s
    scaling = peak.tokens_per_s / base_tps if base_tps else 0.0
    report.section("SCALING ANALYSIS")
    if alone:
        print_alone(alone, sequential, base)
    report.row(f"Baseline ({base.num_users} user(s))", f"{base_tps:.1f} tok/s"
               + (f" ({alone.used})" if alone else ""))
    peak_spread = spreads[levels.index(peak)] if len(spreads) == len(levels) else None
    report.row(f"Peak ({peak.num_users} users)", peak_spread.text(unit=" tok/s")
               if peak_spread and peak_spread.num_passes > 1 else f"{peak.tokens_per_s:.1f} tok/s")
    if not base_tps:
        report.row("Scaling factor", "- (the first level made no tokens)")
    elif alone and peak_spread and peak_spread.num_passes > 1:
        low, high = scaling_range(peak_spread, alone)
        report.row("Scaling factor", f"{fmt.times(scaling, 1)} throughput improvement "
                                     f"({low:.1f}-{high:.1f} from the spreads)")
    else:
        report.row("Scaling factor", f"{fmt.times(scaling, 1)} throughput improvement")
    print()
    report.table(["Users", "Tok/s each", "TPOT (ms)", "Engine core (ms)"],
                 [(lv.num_users, f"{lv.tokens_per_s / lv.num_users:.1f}", fmt.ms(lv.mean_tpot_s),
                   fmt.ms(lv.engine_itl_s)) for lv in levels],
                 widths=[7, 12, 11, 18], align_left=())
    report.note(f"Tok/s each: the level's tok/s over its users. {report.term('TPOT')}, as the "
                f"client saw it. Engine core: vLLM's own {report.term('ITL')}, from /metrics "
                f"('-': not read).")
    with report.detail():
        report.note("The engine core stamps each step as it leaves the engine; the difference "
                    "from the TPOT is what the API server, streaming and HTTP add to the pace. "
                    "A delay every token pays once shows in the TTFT, not here.")
    return scaling


def print_sequential(levels: list[load.LoadLevel], sequential: load.LoadLevel | None) -> None:
    """The largest group one after another against all at once (both measured), and what that
    shows of the batching: that it batched, not which way."""
    largest = max(levels, key=lambda lv: lv.num_users)
    print()
    if sequential is not None:
        sooner = fmt.times(sequential.duration_s / largest.duration_s, 1)
        report.note(f"{largest.num_users} users one after another took "
                    f"{sequential.duration_s:.1f} s (the last waited that long); together they "
                    f"took {largest.duration_s:.1f} s ({sooner} sooner), "
                    f"{sequential.num_ok}/{sequential.num_users} ok. Both measured.")
    report.note(f"This run shows that the requests were batched, not which way: requests of "
                f"one length sent together look the same under {report.term('static batching')} "
                f"and {report.term('continuous batching')}. Task 9 measures the two.")


def insights(levels: list[load.LoadLevel], sequential: load.LoadLevel | None,
             alone: Alone | None = None, in_line_s: float | None = None) -> list[str]:
    """The KEY INSIGHT lines, each chosen from the measured levels, against one request alone
    (alone's baseline; without it, the first level). in_line_s: the largest group's mean time to
    first token one after another, as measured (record.in_line_ttft_s); None: computed from one
    request alone, and the line says so."""
    base, largest = levels[0], max(levels, key=lambda lv: lv.num_users)
    num_failed = num_failed_of(levels, sequential)
    num_sent = sum(lv.num_users for lv in levels) + (sequential.num_users if sequential else 0)
    failed = ([f"{num_failed} of {num_sent} requests FAILED: the figures count only the ones "
               f"that succeeded."] if num_failed else [])
    if not base.num_ok or not largest.num_ok or largest is base:
        users = ", ".join(str(lv.num_users) for lv in levels)
        return failed + [f"Nothing to compare: the levels measured were {users} user(s), and "
                         f"the first and the largest need a successful request each."]
    peak = max(levels, key=lambda lv: lv.tokens_per_s)
    base_tps, base_tpot, alone_s = ((alone.tokens_per_s, alone.tpot_s, alone.latency_s) if alone
                                    else (base.tokens_per_s, base.mean_tpot_s,
                                          base.mean_latency_s))
    scaling = peak.tokens_per_s / base_tps
    tpot_ratio = largest.mean_tpot_s / base_tpot if base_tpot else None
    n, top, ttft = largest.num_users, peak.num_users, largest.mean_ttft_s
    if scaling >= SCALES_AT:
        lines = [f"Throughput SCALES with concurrent users: {scaling:.1f}x from "
                 f"{base.num_users} to {top} users ({base_tps:.1f} -> "
                 f"{peak.tokens_per_s:.1f} tok/s)."]
    elif tpot_ratio:
        lines = [f"Throughput barely grew: {scaling:.1f}x from {base.num_users} to {top} users "
                 f"({base_tps:.1f} -> {peak.tokens_per_s:.1f} tok/s). Each step took "
                 f"{tpot_ratio:.1f}x as long with {n} requests in it."]
    else:
        lines = [f"Throughput barely grew: {scaling:.1f}x from {base.num_users} to {top} users "
                 f"({base_tps:.1f} -> {peak.tokens_per_s:.1f} tok/s)."]
    measured = in_line_s is not None
    in_line = in_line_s if measured else computed_in_line_ttft_s(n, alone_s, base.mean_ttft_s)
    if ttft < IN_LINE_AT * in_line and measured:
        lines.append(f"The {n} requests sent at once got their first token after {ttft:.2f} s "
                     f"on average, and {in_line:.2f} s when sent one after another: they were "
                     f"batched, their first tokens came together, not in line. Task 9 tells "
                     f"continuous batching from static.")
    elif ttft < IN_LINE_AT * in_line:
        lines.append(f"The {n} requests sent at once got their first token after {ttft:.2f} s "
                     f"on average, where one after another would give {in_line:.2f} s "
                     f"(computed from one request alone): they were batched, not served in line. "
                     f"Task 9 tells continuous batching from static.")
    elif measured:
        lines.append(f"Requests queued: at {n} users the mean time to first token "
                     f"({ttft:.2f} s) came near the {in_line:.2f} s of the same requests sent "
                     f"one after another.")
    else:
        lines.append(f"Requests queued: at {n} users the mean time to first token "
                     f"({ttft:.2f} s) came near the {in_line:.2f} s that one after another would "
                     f"give (computed from one request alone).")
    latency = largest.mean_latency_s
    if latency > LATENCY_ROSE_AT * alone_s and scaling >= SCALES_AT:
        lines.append(f"Per-request latency rose from {alone_s:.2f} s alone to {latency:.2f} s "
                     f"({latency / alone_s:.1f}x) at {n} users, while throughput rose "
                     f"{scaling:.1f}x: the price of sharing each step.")
    elif latency > LATENCY_ROSE_AT * alone_s:
        lines.append(f"Per-request latency rose from {alone_s:.2f} s alone to {latency:.2f} s "
                     f"({latency / alone_s:.1f}x) at {n} users, with little more throughput.")
    else:
        lines.append(f"Per-request latency hardly changed ({alone_s:.2f} s alone, "
                     f"{latency:.2f} s at {n} users): the machine had room for the larger "
                     f"batch.")
    return failed + lines
