"""Task 6: Multi-User Throughput Under Load.

Sends 1, then 5, 10 and 20 concurrent users' requests (one each, max_tokens 50) to the lab's
vLLM server (started or reused, or --base-url), streamed with aiohttp so each request has its
time to first token, time per output token and end-to-end latency, as `vllm bench serve`
measures them. One warm-up request first, timed apart. The levels take turns, pass after pass
(--passes, 3 by default): each level's figures are those of its median pass, with the spread of
its passes beside them. Then the largest group one after another: each of those requests is one
request alone, as the 1-user level is, so the two are compared before the scaling factor is
printed. Prints throughput, mean/p50/p95 latency, mean TTFT and the successes per level, the
scaling factor, the per-user speed, and how long the largest group took one after another
against all at once (both measured).

    python task_6_multi_user_load.py [--users 1,5,10,20] [--max-tokens 50] [--passes 3]
        [--no-sequential]
"""
from __future__ import annotations

from common import cli, figures, load, measure, report, results, settings
from lessons.task_6 import FIGURES
from lessons.task_6.record import Alone, MultiUserLoad, alone_of, scaling_range

SCRIPT = "task_6_multi_user_load"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_server_args(parser)
    group = parser.add_argument_group("load")
    group.add_argument("--users", type=cli.int_list, default=[1, 5, 10, 20],
                       help="concurrent users per level, one request each (default 1,5,10,20)")
    group.add_argument("--max-tokens", type=cli.positive_int, default=settings.MAX_NEW_TOKENS,
                       help=f"new tokens per request (default {settings.MAX_NEW_TOKENS})")
    group.add_argument("--passes", type=cli.positive_int, default=measure.PASSES,
                       help=f"passes of every level, taking turns (default {measure.PASSES})")
    group.add_argument("--no-sequential", action="store_true",
                       help="skip sending the largest group one after another")
    return parser.parse_args(argv)


# --- the measurement: the levels, then the largest group one after another -----------------------
def run_level(srv, prompts: list[str], max_tokens: int, concurrent: bool = True
              ) -> load.LoadLevel:
    """One level, with the engine core's own inter-token latency from /metrics."""
    return load.measured_level(srv.base_url, srv.model_name, prompts, max_tokens, concurrent)


def run_sequential(srv, levels: list[load.LoadLevel], max_tokens: int
                   ) -> load.LoadLevel | None:
    """The largest group's requests one after another (None for a group of one)."""
    largest = max(levels, key=lambda lv: lv.num_users)
    if largest.num_users <= 1:
        return None
    print(f"  Sending the {largest.num_users} requests one after another...", flush=True)
    return run_level(srv, load.user_prompts(largest.num_users), max_tokens, concurrent=False)


def num_failed_of(levels: list[load.LoadLevel], sequential: load.LoadLevel | None) -> int:
    return sum(lv.num_failed for lv in levels) + (sequential.num_failed if sequential else 0)


# --- the report: the levels, the scaling, one after another, the insight -------------------------
def print_levels(levels: list[load.LoadLevel], spreads: list[measure.Spread] = ()) -> None:
    report.section("LOAD TEST RESULTS")
    report.table(["Users", "Tokens", "Time(s)", "Tok/s", "Avg(s)", "p50(s)", "p95(s)", "TTFT(s)",
                  "OK"],
                 [(lv.num_users, lv.num_output_tokens, f"{lv.duration_s:.2f}",
                   f"{lv.tokens_per_s:.1f}", load.seconds(lv.mean_latency_s),
                   load.seconds(lv.p50_latency_s), load.seconds(lv.p95_latency_s),
                   load.seconds(lv.mean_ttft_s), f"{lv.num_ok}/{lv.num_users}")
                  for lv in levels],
                 widths=[6, 7, 8, 8, 7, 7, 7, 8, 7], align_left=())
    report.note("Avg, p50, p95: end-to-end latency per request; TTFT: mean time to first token; "
                "'-': no request of the level succeeded")
    if spreads and spreads[0].num_passes > 1:
        report.note(f"Each level's median pass of {spreads[0].num_passes}; tok/s of every pass "
                    "(lowest-highest): " + ", ".join(
                        f"{lv.num_users} user{'s' * (lv.num_users > 1)} {s.low:.1f}-{s.high:.1f}"
                        for lv, s in zip(levels, spreads)))
    for lv in levels:
        for error in lv.errors:
            report.note(f"{lv.num_users} users, failed: {error}", indent=2)


def print_alone(alone: Alone, num_sequential: int) -> None:
    """The two figures of one request alone, and which one the baseline is."""
    report.note("One request alone, measured two ways:")
    report.note(f"the 1-user level: {alone.level.text()}", indent=2)
    if alone.sequential is None:
        return
    report.note(f"the {num_sequential} requests one after another: "
                f"{alone.sequential.text(what='requests')}", indent=2)
    if alone.agree:
        report.note("They agree (the ranges overlap): the baseline is the 1-user level.",
                    indent=2)
    else:
        report.note(f"They DISAGREE (the ranges do not overlap): the baseline is "
                    f"{alone.used}, the one of more passes.", indent=2)


def in_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def print_scaling(levels: list[load.LoadLevel], spreads: list[measure.Spread] = (),
                  alone: Alone | None = None, num_sequential: int = 0) -> float:
    """Peak throughput over one request alone (alone's baseline, else the first level's), and
    each level's speed per user; returns the scaling factor (0 when the baseline made no
    tokens)."""
    base, peak = levels[0], max(levels, key=lambda lv: lv.tokens_per_s)
    base_tps = alone.tokens_per_s if alone else base.tokens_per_s
    scaling = peak.tokens_per_s / base_tps if base_tps else 0.0
    report.section("SCALING ANALYSIS")
    if alone:
        print_alone(alone, num_sequential)
    report.row(f"Baseline ({base.num_users} user(s))", f"{base_tps:.1f} tok/s"
               + (f" ({alone.used})" if alone else ""))
    peak_spread = spreads[levels.index(peak)] if len(spreads) == len(levels) else None
    report.row(f"Peak ({peak.num_users} users)", peak_spread.text(unit=" tok/s")
               if peak_spread and peak_spread.num_passes > 1 else f"{peak.tokens_per_s:.1f} tok/s")
    if not base_tps:
        report.row("Scaling factor", "- (the first level made no tokens)")
    elif alone and peak_spread and peak_spread.num_passes > 1:
        low, high = scaling_range(peak_spread, alone)
        report.row("Scaling factor", f"{scaling:.1f}x throughput improvement ({low:.1f}-"
                                     f"{high:.1f} from the spreads)")
    else:
        report.row("Scaling factor", f"{scaling:.1f}x throughput improvement")
    print()
    report.table(["Users", "Tok/s each", "TPOT (ms)", "Engine core (ms)"],
                 [(lv.num_users, f"{lv.tokens_per_s / lv.num_users:.1f}", in_ms(lv.mean_tpot_s),
                   in_ms(lv.engine_itl_s)) for lv in levels],
                 widths=[7, 12, 11, 18], align_left=())
    report.note("Tok/s each: the level's throughput / its users. TPOT: the client's time per "
                "output token. Engine core: vLLM's own inter-token latency from /metrics, stamped "
                "as each step leaves the engine core ('-': not read). The difference is what "
                "the API server, streaming and HTTP add to the pace; a delay every token pays "
                "once shows in the TTFT, not here.")
    return scaling


def print_sequential(levels: list[load.LoadLevel], sequential: load.LoadLevel) -> None:
    largest = max(levels, key=lambda lv: lv.num_users)
    report.note(f"{largest.num_users} users one after another took {sequential.duration_s:.1f} s "
                f"(the last waited that long); together they took {largest.duration_s:.1f} s "
                f"({sequential.duration_s / largest.duration_s:.1f}x sooner), "
                f"{sequential.num_ok}/{sequential.num_users} ok. Both measured.")


# How the insight reads the figures: throughput "scales" when the peak level makes at least
# SCALES_AT times the tokens/s of the first; latency "rose" when the largest level's mean latency
# is over LATENCY_ROSE_AT times the first level's.
SCALES_AT = 1.5
LATENCY_ROSE_AT = 1.1
# Requests "queued" when their mean time to first token is at least this share of what waiting
# in line one after another would give them (in_line_ttft_s): half way from none to all of it.
IN_LINE_AT = 0.5


def in_line_ttft_s(num_users: int, alone_s: float, alone_ttft_s: float) -> float:
    """The mean time to first token of num_users requests served one after another, each taking
    what one request alone took: the k-th waits for the k - 1 before it, (n - 1) / 2 on average."""
    return (num_users - 1) / 2 * alone_s + alone_ttft_s


def insights(levels: list[load.LoadLevel], sequential: load.LoadLevel | None,
             alone: Alone | None = None) -> list[str]:
    """The KEY INSIGHT lines, each chosen or worded from the measured levels, against one
    request alone (alone's baseline; without it, the first level)."""
    base, largest = levels[0], max(levels, key=lambda lv: lv.num_users)
    num_failed = num_failed_of(levels, sequential)
    num_sent = sum(lv.num_users for lv in levels) + (sequential.num_users if sequential else 0)
    failed = ([f"{num_failed} of {num_sent} requests FAILED: the figures count only the ones "
               f"that succeeded"] if num_failed else [])
    if not base.num_ok or not largest.num_ok or largest is base:
        return failed + [f"Nothing to compare: the levels measured were "
                         f"{', '.join(str(lv.num_users) for lv in levels)} user(s), and the "
                         f"first and largest need a successful request each"]
    peak = max(levels, key=lambda lv: lv.tokens_per_s)
    base_tps, base_tpot, alone_s = ((alone.tokens_per_s, alone.tpot_s, alone.latency_s) if alone
                                    else (base.tokens_per_s, base.mean_tpot_s,
                                          base.mean_latency_s))
    scaling = peak.tokens_per_s / base_tps
    tpot_ratio = largest.mean_tpot_s / base_tpot if base_tpot else None
    if scaling >= SCALES_AT:
        lines = [f"Throughput SCALES with concurrent users: {scaling:.1f}x from "
                 f"{base.num_users} to {peak.num_users} users ({base_tps:.1f} -> "
                 f"{peak.tokens_per_s:.1f} tok/s)"]
    else:
        lines = [f"Throughput barely grew: {scaling:.1f}x from {base.num_users} to "
                 f"{peak.num_users} users ({base_tps:.1f} -> "
                 f"{peak.tokens_per_s:.1f} tok/s)"
                 + (f"; each step took {tpot_ratio:.1f}x as long with {largest.num_users} "
                    f"requests in it" if tpot_ratio else "")]
    ttft, n = largest.mean_ttft_s, largest.num_users
    in_line = in_line_ttft_s(n, alone_s, base.mean_ttft_s)
    if ttft < IN_LINE_AT * in_line:
        lines.append(f"The {n} requests sent at once got their first token after {ttft:.2f} s "
                     f"on average ({base.mean_ttft_s:.2f} s alone); waiting in line, one after "
                     f"another, they would have got it after {in_line:.2f} s: the engine "
                     f"batched them as they arrived (continuous batching)")
    else:
        lines.append(f"Requests queued: at {n} users the mean time to first token "
                     f"({ttft:.2f} s) came near what waiting in line one after another gives "
                     f"({in_line:.2f} s)")
    latency = largest.mean_latency_s
    if latency > LATENCY_ROSE_AT * alone_s:
        lines.append(f"Per-request latency rose from {alone_s:.2f} s alone to {latency:.2f} s "
                     f"({latency / alone_s:.1f}x) at {largest.num_users} users"
                     + (f", while throughput rose {scaling:.1f}x: the price of sharing each "
                        f"step" if scaling >= SCALES_AT else ", with little more throughput"))
    else:
        lines.append(f"Per-request latency hardly changed ({alone_s:.2f} s alone, "
                     f"{latency:.2f} s at {largest.num_users} users): the machine had room for "
                     f"the larger batch")
    return failed + lines


def main(argv: list[str] | None = None) -> MultiUserLoad:
    args = parse_args(argv)
    report.title("Task 6: Multi-User Throughput Under Load")
    srv, model, dtype = cli.lab_server(args.base_url, args.model, args.dtype, host=args.host,
                                       port=args.port)
    if model:
        report.run_info(model, dtype, settings.num_cores(), Engine=srv.config.describe())
    report.row("Server", f"{srv.base_url} ({srv.state})")
    report.row("Load test plan", f"{', '.join(map(str, args.users))} concurrent users")
    report.row("Each user sends", f"1 streamed request, max_tokens={args.max_tokens}")
    report.row("Passes", f"{args.passes} of every level, taking turns; the median pass shown")

    warmup = load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)
    if warmup.num_failed:
        cli.fail(f"the warm-up request failed: {warmup.errors[0]}", code=1)
    report.note(f"Warm-up request done ({warmup.duration_s:.2f} s, not counted).")
    passes = load.levels_in_turns(srv.base_url, srv.model_name, args.users, args.max_tokens,
                                  args.passes)
    levels = load.median_passes(passes)
    spreads = [measure.Spread.of(lv.tokens_per_s for lv in p) for p in passes]
    sequential = None if args.no_sequential else run_sequential(srv, levels, args.max_tokens)
    print_levels(levels, spreads)

    alone = alone_of(passes[0], sequential) if levels[0].num_users == 1 else None
    scaling = print_scaling(levels, spreads, alone,
                            sequential.num_users if sequential else 0)
    if sequential:
        print_sequential(levels, sequential)

    report.insight(insights(levels, sequential, alone))
    peak = max(range(len(levels)), key=lambda i: levels[i].tokens_per_s)
    record = MultiUserLoad(
        header=results.RunHeader.of(model, dtype, settings.num_cores(), srv.model_name),
        base_url=srv.base_url, server_state=srv.state, users_per_level=args.users,
        max_tokens=args.max_tokens, temperature=settings.TEMPERATURE, levels=levels,
        scaling_factor=scaling, server_config=srv.config.describe() if srv.config else None,
        sequential=sequential, num_passes=len(passes[0]), spreads=spreads, alone=alone,
        scaling_range=(scaling_range(spreads[peak], alone)
                       if alone and levels[peak].tokens_per_s and alone.tokens_per_s else None))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(num_failed_of([lv for p in passes for lv in p], sequential))
    return record


if __name__ == "__main__":
    cli.run(main)
