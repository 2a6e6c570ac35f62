"""Task 6: Multi-User Throughput Under Load.

Sends 1, then 5, 10 and 20 concurrent users' requests (one each, max_tokens 50) to the lab's
vLLM server (started or reused, or --base-url), streamed with aiohttp so each request has its
time to first token, time per output token and end-to-end latency, as `vllm bench serve`
measures them. One warm-up request first. Prints throughput, mean/p50/p95 latency, mean TTFT and
the successes per level, the scaling factor, the per-user speed, and how long the largest group
took one after another against all at once (both measured).

    python task_6_multi_user_load.py [--users 1,5,10,20] [--max-tokens 50] [--no-sequential]
"""
from __future__ import annotations

from common import cli, figures, load, report, results, settings

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
    group.add_argument("--no-sequential", action="store_true",
                       help="skip sending the largest group one after another")
    return parser.parse_args(argv)


# How the insight reads the figures: throughput "scales" when the peak level makes at least
# SCALES_AT times the tokens/s of the first; latency "rose" when the largest level's mean latency
# is over LATENCY_ROSE_AT times the first level's.
SCALES_AT = 1.5
LATENCY_ROSE_AT = 1.1


def insights(levels: list[load.LevelResult], sequential: load.LevelResult | None) -> list[str]:
    """The KEY INSIGHT lines, each chosen or worded from the measured levels."""
    base, largest = levels[0], max(levels, key=lambda lv: lv.num_users)
    num_failed = sum(lv.num_failed for lv in levels) + (sequential.num_failed if sequential else 0)
    num_sent = sum(lv.num_users for lv in levels) + (sequential.num_users if sequential else 0)
    failed = ([f"{num_failed} of {num_sent} requests FAILED: the figures count only the ones "
               f"that succeeded"] if num_failed else [])
    if not base.ok or not largest.ok or largest is base:
        return failed + [f"Nothing to compare: the levels measured were "
                         f"{', '.join(str(lv.num_users) for lv in levels)} user(s), and the "
                         f"first and largest need a successful request each"]
    peak = max(levels, key=lambda lv: lv.throughput)
    scaling = peak.throughput / base.throughput
    tpot_ratio = (largest.latency_stat("tpot_s") / base.latency_stat("tpot_s")
                  if base.latency_stat("tpot_s") else None)
    if scaling >= SCALES_AT:
        lines = [f"Throughput SCALES with concurrent users: {scaling:.1f}x from "
                 f"{base.num_users} to {peak.num_users} users ({base.throughput:.1f} -> "
                 f"{peak.throughput:.1f} tok/s)"]
    else:
        lines = [f"Throughput barely grew: {scaling:.1f}x from {base.num_users} to "
                 f"{peak.num_users} users ({base.throughput:.1f} -> {peak.throughput:.1f} tok/s)"
                 + (f"; each step took {tpot_ratio:.1f}x as long with {largest.num_users} "
                    f"requests in it" if tpot_ratio else "")]
    ttft, alone = largest.latency_stat("ttft_s"), base.latency_stat("latency_s")
    if ttft < alone:
        lines.append(f"The {largest.num_users} requests sent at once got their first token "
                     f"after {ttft:.2f} s on average, sooner than one request takes alone "
                     f"({alone:.2f} s): none waited for another to finish, the engine batched "
                     f"them as they arrived (continuous batching)")
    else:
        lines.append(f"Requests queued: at {largest.num_users} users the mean time to first "
                     f"token ({ttft:.2f} s) was longer than one whole request alone "
                     f"({alone:.2f} s)")
    latency = largest.latency_stat("latency_s")
    if latency > LATENCY_ROSE_AT * alone:
        lines.append(f"Per-request latency rose {alone:.2f} -> {latency:.2f} s "
                     f"({latency / alone:.1f}x) at {largest.num_users} users"
                     + (f", while throughput rose {scaling:.1f}x: the price of sharing each "
                        f"step" if scaling >= SCALES_AT else ", with little more throughput"))
    else:
        lines.append(f"Per-request latency hardly changed ({alone:.2f} -> {latency:.2f} s at "
                     f"{largest.num_users} users): the machine had room for the larger batch")
    return failed + lines


def run_levels(srv, users: list[int], max_tokens: int) -> list[load.LevelResult]:
    levels = []
    for num_users in users:
        print(f"  Testing {num_users} users...", end=" ", flush=True)
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(num_users),
                               max_tokens)
        levels.append(level)
        print(f"{level.throughput:.1f} tok/s, {level.seconds(level.latency_stat('latency_s'))} s "
              f"avg, {len(level.ok)}/{num_users} ok", flush=True)
    return levels


def print_levels(levels: list[load.LevelResult]) -> None:
    report.section("LOAD TEST RESULTS")
    report.table(["Users", "Tokens", "Time(s)", "Tok/s", "Avg(s)", "p50(s)", "p95(s)", "TTFT(s)",
                  "OK"],
                 [(lv.num_users, lv.total_tokens, f"{lv.duration_s:.2f}", f"{lv.throughput:.1f}",
                   lv.seconds(lv.latency_stat("latency_s")), lv.seconds(lv.latency_percentile(50)),
                   lv.seconds(lv.latency_percentile(95)), lv.seconds(lv.latency_stat("ttft_s")),
                   f"{len(lv.ok)}/{lv.num_users}")
                  for lv in levels],
                 widths=[6, 7, 8, 8, 7, 7, 7, 8, 7], align_left=())
    report.note("Avg, p50, p95: end-to-end latency per request; TTFT: mean time to first token; "
                "'-': no request of the level succeeded")
    for lv in levels:
        for error in lv.errors:
            report.note(f"{lv.num_users} users, failed: {error}", indent=2)


def print_scaling(levels: list[load.LevelResult]) -> float:
    """Peak throughput over the first level's, and each level's speed per user; returns the
    scaling factor (0 when the first level made no tokens)."""
    base, peak = levels[0], max(levels, key=lambda lv: lv.throughput)
    scaling = peak.throughput / base.throughput if base.throughput else 0.0
    report.section("SCALING ANALYSIS")
    report.row(f"Baseline ({base.num_users} user(s))", f"{base.throughput:.1f} tok/s")
    report.row(f"Peak ({peak.num_users} users)", f"{peak.throughput:.1f} tok/s")
    report.row("Scaling factor", f"{scaling:.1f}x throughput improvement" if base.throughput
               else "- (the first level made no tokens)")
    report.note("Per-user effective speed (throughput / users):")
    for lv in levels:
        tpot = f"{1000 * lv.latency_stat('tpot_s'):.0f} ms" if lv.ok else "-"
        report.note(f"{lv.num_users:>4} users: {lv.throughput / lv.num_users:6.1f} tok/s each, "
                    f"time per output token {tpot}", indent=2)
    return scaling


def run_sequential(srv, levels: list[load.LevelResult], max_tokens: int
                   ) -> load.LevelResult | None:
    """The largest group's requests one after another (None for a group of one)."""
    largest = max(levels, key=lambda lv: lv.num_users)
    if largest.num_users <= 1:
        return None
    print(f"  Sending the {largest.num_users} requests one after another...", flush=True)
    sequential = load.run_level(srv.base_url, srv.model_name,
                                load.user_prompts(largest.num_users), max_tokens,
                                concurrent=False)
    report.note(f"{largest.num_users} users one after another took {sequential.duration_s:.1f} s "
                f"(the last waited that long); together they took {largest.duration_s:.1f} s "
                f"({sequential.duration_s / largest.duration_s:.1f}x sooner), "
                f"{len(sequential.ok)}/{sequential.num_users} ok. Both measured.")
    return sequential


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report.title("Task 6: Multi-User Throughput Under Load")
    srv, model, dtype = cli.lab_server(args.base_url, args.model, args.dtype, host=args.host,
                                       port=args.port)
    if model:
        report.run_info(model, dtype, settings.num_cores(), Engine=srv.config.describe())
    report.row("Server", f"{srv.base_url} ({srv.state})")
    report.row("Load test plan", f"{', '.join(map(str, args.users))} concurrent users")
    report.row("Each user sends", f"1 streamed request, max_tokens={args.max_tokens}")

    warmup = load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)
    if warmup.num_failed:
        cli.fail(f"the warm-up request failed: {warmup.requests[0].error}", code=1)
    report.note(f"Warm-up request done ({warmup.duration_s:.2f} s, not counted).")
    levels = run_levels(srv, args.users, args.max_tokens)
    print_levels(levels)

    scaling = print_scaling(levels)
    sequential = None if args.no_sequential else run_sequential(srv, levels, args.max_tokens)

    report.insight(insights(levels, sequential))
    header = results.RunHeader.of(model, dtype, settings.num_cores(), srv.model_name)
    data = {"base_url": srv.base_url, "server_state": srv.state,
            "settings": {"users": args.users, "max_tokens": args.max_tokens,
                         "temperature": settings.TEMPERATURE,
                         "server": srv.config.describe() if srv.config else None},
            "levels": [lv.summary() for lv in levels],
            "scaling_factor": round(scaling, 2),
            "sequential": sequential.summary() if sequential else None}
    figures.saved(results.save(SCRIPT, header, results.MultiUserLoad.from_dict(data)))
    cli.fail_if_any_failed(sum(lv.num_failed for lv in levels)
                           + (sequential.num_failed if sequential else 0))
    return header.__dict__ | data


if __name__ == "__main__":
    cli.run(main)
