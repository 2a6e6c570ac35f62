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

from common import cli, load, report, results, settings

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


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report.title("Task 6: Multi-User Throughput Under Load")
    srv, model, dtype = cli.lab_server(args)
    if model:
        report.run_info(model, dtype, settings.num_cores(), Engine=srv.config.describe())
    report.row("Server", f"{srv.base_url} ({srv.state})")
    report.row("Load test plan", f"{args.users} concurrent users")
    report.row("Each user sends", f"1 streamed request, max_tokens={args.max_tokens}")

    warmup = load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)
    if warmup.num_failed:
        cli.fail(f"the warm-up request failed: {warmup.requests[0].error}", code=1)
    report.note(f"Warm-up request done ({warmup.duration_s:.2f} s, not counted).")

    levels = []
    for num_users in args.users:
        print(f"  Testing with {num_users} concurrent user(s)...", end=" ", flush=True)
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(num_users),
                               args.max_tokens)
        levels.append(level)
        print(f"done ({level.throughput:.1f} tok/s, {level.latency_stat('latency_s'):.2f}s avg "
              f"latency, {len(level.ok)}/{num_users} ok)", flush=True)

    report.section("LOAD TEST RESULTS")
    report.table(["Users", "Tokens", "Time(s)", "Tok/s", "Avg(s)", "p50(s)", "p95(s)", "TTFT(s)",
                  "Success"],
                 [(lv.num_users, lv.total_tokens, f"{lv.duration_s:.2f}", f"{lv.throughput:.1f}",
                   f"{lv.latency_stat('latency_s'):.2f}", f"{lv.latency_percentile(50):.2f}",
                   f"{lv.latency_percentile(95):.2f}", f"{lv.latency_stat('ttft_s'):.2f}",
                   f"{len(lv.ok)}/{lv.num_users}")
                  for lv in levels],
                 widths=[6, 8, 9, 8, 8, 8, 8, 9, 9], align_left=())
    for lv in levels:
        for error in lv.summary()["errors"]:
            report.note(f"  {lv.num_users} users, failed: {error}")

    base, peak = levels[0], max(levels, key=lambda lv: lv.throughput)
    scaling = peak.throughput / base.throughput if base.throughput else 0.0
    report.section("SCALING ANALYSIS")
    report.row(f"Baseline ({base.num_users} user(s))", f"{base.throughput:.1f} tok/s")
    report.row(f"Peak ({peak.num_users} users)", f"{peak.throughput:.1f} tok/s")
    report.row("Scaling factor", f"{scaling:.1f}x throughput improvement")
    report.note("Per-user effective speed (throughput / users):")
    for lv in levels:
        report.note(f"{lv.num_users:>4} users: {lv.throughput / lv.num_users:6.1f} tok/s each, "
                    f"mean time per output token {1000 * lv.latency_stat('tpot_s'):.0f} ms", indent=2)

    sequential = None
    largest = max(levels, key=lambda lv: lv.num_users)
    if not args.no_sequential and largest.num_users > 1:
        print(f"  Sending the {largest.num_users} requests one after another...", flush=True)
        sequential = load.run_level(srv.base_url, srv.model_name,
                                    load.user_prompts(largest.num_users), args.max_tokens,
                                    concurrent=False)
        report.note(f"{largest.num_users} users one after another took {sequential.duration_s:.1f} s "
                    f"(the last waited that long); together they took {largest.duration_s:.1f} s "
                    f"({sequential.duration_s / largest.duration_s:.1f}x sooner). Both measured.")

    report.insight([
        f"Throughput SCALES with concurrent users: {scaling:.1f}x from {base.num_users} to "
        f"{peak.num_users} users",
        "vLLM uses continuous batching - it does not wait for a batch to fill",
        "Per-request latency increases but total throughput improves",
    ])
    data = {"model": srv.model_name, "model_source": model.source if model else "external",
            "dtype": dtype.dtype if dtype else None, "threads": settings.num_cores(),
            "base_url": srv.base_url, "server_state": srv.state,
            "settings": {"users": args.users, "max_tokens": args.max_tokens,
                         "temperature": settings.TEMPERATURE,
                         "server": srv.config.describe() if srv.config else None},
            "levels": [lv.summary() for lv in levels],
            "scaling_factor": round(scaling, 2),
            "sequential": sequential.summary() if sequential else None}
    print(f"Saved: {results.save(SCRIPT, data)}")
    return data


if __name__ == "__main__":
    cli.run(main)
