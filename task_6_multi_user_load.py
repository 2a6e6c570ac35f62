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
against all at once (both measured). Its report's printing and insight: lessons/task_6/report.py.

    python task_6_multi_user_load.py [--users 1,5,10,20] [--max-tokens 50] [--passes 3]
        [--no-sequential]
"""
from __future__ import annotations

from common import cli, figures, load, measure, report, results, settings
from lessons.task_6 import FIGURES
from lessons.task_6 import report as show
from lessons.task_6.record import (MultiUserLoad, alone_of, in_line_ttft_s, num_failed_of,
                                   scaling_range)

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
    show.print_levels(levels, spreads)

    alone = alone_of(passes[0], sequential) if levels[0].num_users == 1 else None
    scaling = show.print_scaling(levels, spreads, alone, sequential)
    show.print_sequential(levels, sequential)
    in_line_s = in_line_ttft_s(sequential) if sequential else None
    report.detail_hint()
    report.insight(show.insights(levels, sequential, alone, in_line_s))
    peak = max(range(len(levels)), key=lambda i: levels[i].tokens_per_s)
    record = MultiUserLoad(
        header=results.RunHeader.of(model, dtype, settings.num_cores(), srv.model_name),
        base_url=srv.base_url, server_state=srv.state, users_per_level=args.users,
        max_tokens=args.max_tokens, temperature=settings.TEMPERATURE, levels=levels,
        scaling_factor=scaling, server_config=srv.config.describe() if srv.config else None,
        sequential=sequential, num_passes=len(passes[0]), spreads=spreads, alone=alone,
        scaling_range=(scaling_range(spreads[peak], alone)
                       if alone and levels[peak].tokens_per_s and alone.tokens_per_s else None),
        sequential_in_line_ttft_s=in_line_s)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(num_failed_of([lv for p in passes for lv in p], sequential))
    return record


if __name__ == "__main__":
    cli.run(main)
