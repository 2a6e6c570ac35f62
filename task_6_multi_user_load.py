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

from dataclasses import dataclass

from common import cli, figures, load, report, results, settings

SCRIPT = "task_6_multi_user_load"


@dataclass
class MultiUserLoad(results.Result):
    """Task 6's result: every level as it was measured (common.load.LoadLevel), the server it
    ran against and the load's settings."""
    base_url: str
    server_state: str                   # started, reused, restarted or external (--base-url)
    users_per_level: list[int]          # --users, in the order the levels ran
    max_tokens: int                     # new tokens per request
    temperature: float
    levels: list[load.LoadLevel]
    scaling_factor: float               # peak tokens/s over the first level's (0: it made none)
    server_config: str | None = None    # the lab's server's settings (None: --base-url)
    sequential: load.LoadLevel | None = None   # the largest group one after another


RECORD = MultiUserLoad


def summary_row(m: MultiUserLoad) -> str:
    measured = [lv for lv in m.levels if lv.tokens_per_s]
    if not measured:
        return "no level made a token"
    top = max(measured, key=lambda lv: lv.tokens_per_s)
    return f"{top.num_users} users {top.tokens_per_s:.1f} tok/s ({m.scaling_factor:.1f}x)"


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


# --- the measurement: the levels, then the largest group one after another -----------------------
def run_levels(srv, users: list[int], max_tokens: int) -> list[load.LoadLevel]:
    levels = []
    for num_users in users:
        print(f"  Testing {num_users} users...", end=" ", flush=True)
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(num_users),
                               max_tokens)
        levels.append(level)
        print(f"{level.tokens_per_s:.1f} tok/s, {load.seconds(level.mean_latency_s)} s avg, "
              f"{level.num_ok}/{num_users} ok", flush=True)
    return levels


def run_sequential(srv, levels: list[load.LoadLevel], max_tokens: int
                   ) -> load.LoadLevel | None:
    """The largest group's requests one after another (None for a group of one)."""
    largest = max(levels, key=lambda lv: lv.num_users)
    if largest.num_users <= 1:
        return None
    print(f"  Sending the {largest.num_users} requests one after another...", flush=True)
    return load.run_level(srv.base_url, srv.model_name, load.user_prompts(largest.num_users),
                          max_tokens, concurrent=False)


def num_failed_of(levels: list[load.LoadLevel], sequential: load.LoadLevel | None) -> int:
    return sum(lv.num_failed for lv in levels) + (sequential.num_failed if sequential else 0)


# --- the report: the levels, the scaling, one after another, the insight -------------------------
def print_levels(levels: list[load.LoadLevel]) -> None:
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
    for lv in levels:
        for error in lv.errors:
            report.note(f"{lv.num_users} users, failed: {error}", indent=2)


def print_scaling(levels: list[load.LoadLevel]) -> float:
    """Peak throughput over the first level's, and each level's speed per user; returns the
    scaling factor (0 when the first level made no tokens)."""
    base, peak = levels[0], max(levels, key=lambda lv: lv.tokens_per_s)
    scaling = peak.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
    report.section("SCALING ANALYSIS")
    report.row(f"Baseline ({base.num_users} user(s))", f"{base.tokens_per_s:.1f} tok/s")
    report.row(f"Peak ({peak.num_users} users)", f"{peak.tokens_per_s:.1f} tok/s")
    report.row("Scaling factor", f"{scaling:.1f}x throughput improvement" if base.tokens_per_s
               else "- (the first level made no tokens)")
    report.note("Per-user effective speed (throughput / users):")
    for lv in levels:
        tpot = "-" if lv.mean_tpot_s is None else f"{1000 * lv.mean_tpot_s:.0f} ms"
        report.note(f"{lv.num_users:>4} users: {lv.tokens_per_s / lv.num_users:6.1f} tok/s each, "
                    f"time per output token {tpot}", indent=2)
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


def insights(levels: list[load.LoadLevel], sequential: load.LoadLevel | None) -> list[str]:
    """The KEY INSIGHT lines, each chosen or worded from the measured levels."""
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
    scaling = peak.tokens_per_s / base.tokens_per_s
    tpot_ratio = largest.mean_tpot_s / base.mean_tpot_s if base.mean_tpot_s else None
    if scaling >= SCALES_AT:
        lines = [f"Throughput SCALES with concurrent users: {scaling:.1f}x from "
                 f"{base.num_users} to {peak.num_users} users ({base.tokens_per_s:.1f} -> "
                 f"{peak.tokens_per_s:.1f} tok/s)"]
    else:
        lines = [f"Throughput barely grew: {scaling:.1f}x from {base.num_users} to "
                 f"{peak.num_users} users ({base.tokens_per_s:.1f} -> "
                 f"{peak.tokens_per_s:.1f} tok/s)"
                 + (f"; each step took {tpot_ratio:.1f}x as long with {largest.num_users} "
                    f"requests in it" if tpot_ratio else "")]
    ttft, alone = largest.mean_ttft_s, base.mean_latency_s
    if ttft < alone:
        lines.append(f"The {largest.num_users} requests sent at once got their first token "
                     f"after {ttft:.2f} s on average, sooner than one request takes alone "
                     f"({alone:.2f} s): none waited for another to finish, the engine batched "
                     f"them as they arrived (continuous batching)")
    else:
        lines.append(f"Requests queued: at {largest.num_users} users the mean time to first "
                     f"token ({ttft:.2f} s) was longer than one whole request alone "
                     f"({alone:.2f} s)")
    latency = largest.mean_latency_s
    if latency > LATENCY_ROSE_AT * alone:
        lines.append(f"Per-request latency rose {alone:.2f} -> {latency:.2f} s "
                     f"({latency / alone:.1f}x) at {largest.num_users} users"
                     + (f", while throughput rose {scaling:.1f}x: the price of sharing each "
                        f"step" if scaling >= SCALES_AT else ", with little more throughput"))
    else:
        lines.append(f"Per-request latency hardly changed ({alone:.2f} -> {latency:.2f} s at "
                     f"{largest.num_users} users): the machine had room for the larger batch")
    return failed + lines


# --- the figure ----------------------------------------------------------------------------------
def draw_load_levels(res: MultiUserLoad):
    """tokens/s and latency (p50, p95, TTFT) against concurrent users; the largest group one
    after another against all together."""
    levels = [lv for lv in res.levels if lv.num_ok]
    users = [lv.num_users for lv in levels]
    fig, (tps, lat, seq) = figures.figure(4.2, 1, 3, width_ratios=[1.2, 1.2, 1])
    tps.plot(users, [lv.tokens_per_s for lv in levels], "o-", color=figures.color(4))
    for lv in levels:
        tps.annotate(f"{lv.tokens_per_s:.1f}", (lv.num_users, lv.tokens_per_s),
                     textcoords="offset points", xytext=(0, 7), ha="center", fontsize=9)
    tps.set(title="Throughput", xlabel="concurrent users", ylabel="tokens/s (all users)")
    for values, label, color, marker in (
            ([lv.p50_latency_s for lv in levels], "p50 latency", 4, "o"),
            ([lv.p95_latency_s for lv in levels], "p95 latency", 5, "s"),
            ([lv.mean_ttft_s for lv in levels], "mean time to first token", 2, "^")):
        lat.plot(users, values, marker=marker, color=figures.color(color), label=label)
    lat.set(title="Latency per request", xlabel="concurrent users", ylabel="seconds")
    lat.legend(fontsize=9)
    for ax in (tps, lat):
        ax.set_xticks(users)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    together = max(levels, key=lambda lv: lv.num_users) if levels else None
    if res.sequential and together:
        both = [("one after\nanother", res.sequential.duration_s, figures.color(5)),
                ("all\ntogether", together.duration_s, figures.color(2))]
        bars = seq.bar([b[0] for b in both], [b[1] for b in both], color=[b[2] for b in both])
        seq.bar_label(bars, fmt="%.1f s")
        seq.set(title=f"{together.num_users} users' requests",
                ylabel="seconds until the last finished")
    else:
        seq.text(0.5, 0.5, "not measured\n(--no-sequential)", ha="center", va="center",
                 transform=seq.transAxes)
        seq.set(title="One after another", xticks=[], yticks=[])
    return figures.finish(fig, "Task 6: more users, more tokens/s (one streamed request each)",
                          res)


FIGURES = (("", draw_load_levels),)


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

    warmup = load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)
    if warmup.num_failed:
        cli.fail(f"the warm-up request failed: {warmup.errors[0]}", code=1)
    report.note(f"Warm-up request done ({warmup.duration_s:.2f} s, not counted).")
    levels = run_levels(srv, args.users, args.max_tokens)
    print_levels(levels)

    scaling = print_scaling(levels)
    sequential = None if args.no_sequential else run_sequential(srv, levels, args.max_tokens)
    if sequential:
        print_sequential(levels, sequential)

    report.insight(insights(levels, sequential))
    record = MultiUserLoad(
        header=results.RunHeader.of(model, dtype, settings.num_cores(), srv.model_name),
        base_url=srv.base_url, server_state=srv.state, users_per_level=args.users,
        max_tokens=args.max_tokens, temperature=settings.TEMPERATURE, levels=levels,
        scaling_factor=scaling, server_config=srv.config.describe() if srv.config else None,
        sequential=sequential)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(num_failed_of(levels, sequential))
    return record


if __name__ == "__main__":
    cli.run(main)
