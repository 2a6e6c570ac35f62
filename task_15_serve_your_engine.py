"""Task 15: Serve the engine you built - mini_engine behind an OpenAI-compatible server.

Tasks 9-14 rebuilt the engine; this task gives it vLLM's front door (mini_engine/server/: the
step loop apart from the event loop, one output queue a request, text made token by token,
aborts when a client leaves, /metrics under vLLM's names) and puts it beside vLLM's own server
and `transformers serve --continuous-batching`, one at a time (two cores cannot host two):

1. The same client: task 5's OpenAI SDK call, only base_url changed.
2. The same load: task 6's levels (1, 5, 10, 20 users, one streamed request each), in passes
   that take turns within each server; the largest level's requests drawn as timelines.
3. What the front door costs: each server's tokens/s at 1 and at the most users over its own
   engine offline, on the same requests (lessons/task_15/offline.py, in a fresh process once
   the server has stopped), and where the difference goes: the engine's own inter-token
   latency, read from its /metrics, against the client's time per output token.

vLLM and mini_engine run the lab's engine settings (max_model_len 128, 128 MiB of KV in
16-token pages, 256 sequences, prefix caching on); transformers runs its own engine, its KV
pool the same bytes in the same pages. The servers: lessons/task_15/servers.py; the record:
lessons/task_15/record.py; the report: lessons/task_15/report.py.

    python task_15_serve_your_engine.py [--users 1,5,10,20] [--max-tokens 50] [--passes 3]
        [--servers vLLM,mini_engine,transformers] [--no-offline] [--port 8000] [--kernels c]
        [--model M] [--dtype auto|bfloat16|float32]
"""
from __future__ import annotations

import contextlib

from common import cli, figures, load, measure, report, results, server, settings
from lessons.task_15 import FIGURES
from lessons.task_15.record import Offline, ServerRun, ThreeServers, Timeline
from lessons.task_15.report import print_report
from lessons.task_15.servers import (WAYS, Settings, Started, mini_engine_command,
                                     transformers_command)

SCRIPT = "task_15_serve_your_engine"
PROMPT = "What is inference in machine learning?"     # task 5's
# how each server is told to make every token it is asked for (common/load.py: HOLD_EOS)
HOLD_EOS = {"vLLM": "min_tokens", "mini_engine": "min_tokens",
            "transformers": "generation_config"}
OFFLINE_TIMEOUT_S = 600


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_argument_group("load")
    group.add_argument("--users", type=cli.int_list, default=[1, 5, 10, 20],
                       help="concurrent users of each level (default 1,5,10,20: task 6's)")
    group.add_argument("--max-tokens", type=cli.positive_int, default=settings.MAX_NEW_TOKENS,
                       help=f"tokens each request makes (default {settings.MAX_NEW_TOKENS})")
    group.add_argument("--passes", type=cli.positive_int, default=measure.PASSES,
                       help=f"passes of every level and of offline, taking turns (default "
                            f"{measure.PASSES})")
    group.add_argument("--no-offline", action="store_true",
                       help="skip each engine's offline run (part 3: the front door unpriced)")
    group.add_argument("--servers", default=",".join(WAYS),
                       help=f"which servers, in order (default {','.join(WAYS)})")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT}); the "
                            "other two take free ports")
    cli.add_kernels_arg(parser)
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    args.servers = [w.strip() for w in args.servers.split(",") if w.strip()]
    unknown = [w for w in args.servers if w not in WAYS]
    if unknown or not args.servers:
        parser.error(f"--servers: {', '.join(unknown) or 'none given'}: choose from "
                     f"{', '.join(WAYS)}")
    return args


# --- one server: started, called, loaded, stopped ------------------------------------------------
def in_detail(line: str) -> None:
    """A server's start, a line at a time (stopping, starting, still starting): --detail's."""
    with report.detail():
        report.note(line, indent=2)


@contextlib.contextmanager
def started(way: str, args, model, dtype: str, s: Settings):
    """(base URL, model name the clients ask for, seconds until /health answered or None when an
    already running lab server was reused, its command); stopped on the way out."""
    if way == "vLLM":
        config = server.ServerConfig(model.path, model.name, dtype, max_num_seqs=s.max_num_seqs,
                                     port=args.port)
        try:
            srv = server.ensure_server(config, progress=in_detail)
            yield srv.base_url, srv.model_name, srv.startup_s, "vllm.entrypoints.openai.api_server"
        finally:
            server.stop_server(args.port)      # the next server needs the cores
        return
    port = server.free_port()
    if way == "mini_engine":
        command = mini_engine_command(model.path, model.name, dtype, port, s, args.kernels)
        name, shown = model.name, f"python -m mini_engine.server --kernels {args.kernels}"
    else:
        command = transformers_command(model.path, dtype, port, s)
        name, shown = model.path, "transformers serve --continuous-batching"
    with Started(way, command, port, progress=in_detail) as srv:
        yield srv.base_url, name, srv.startup_s, shown


def measure_server(way: str, args, model, dtype: str, s: Settings) -> ServerRun:
    """Started, its first request (a warm-up, timed apart), task 5's SDK call, the levels in
    passes; then, once it has stopped, its engine offline."""
    hold = HOLD_EOS[way]
    print(f"{way}: starting...", end=" ", flush=True)
    with started(way, args, model, dtype, s) as (base_url, name, startup_s, command):
        print(f"ready after {startup_s:.1f} s" if startup_s is not None else
              "the lab's server was running with these settings: reused", flush=True)
        first = load.run_level(base_url, name, load.user_prompts(1), args.max_tokens,
                               hold_eos=hold)
        if first.num_failed:
            return ServerRun(way, command, skipped=f"its first request failed: {first.errors[0]}")
        try:
            call = load.send_openai(base_url, name, PROMPT, args.max_tokens, hold)
        except load.CallFailed as e:
            return ServerRun(way, command, skipped=str(e))
        print(f"  {', '.join(map(str, args.users))} users, {args.passes} "
              f"pass{'es' * (args.passes > 1)} each...", end=" ", flush=True)
        with report.detail():      # a line a pass
            passes = load.levels_in_turns(base_url, name, args.users, args.max_tokens,
                                          args.passes, hold_eos=hold, indent="  ")
    levels = load.median_passes(passes)
    print(", ".join(f"{lv.tokens_per_s:.0f}" for lv in levels) + " tok/s", flush=True)
    run = ServerRun(way, command, startup_s=startup_s, first_request_s=first.duration_s,
                    sdk_call=call, levels=levels,
                    spreads=[measure.Spread.of(lv.tokens_per_s for lv in p) for p in passes],
                    timeline=Timeline.of(max(levels, key=lambda lv: lv.num_users)))
    if not args.no_offline:
        run_offline(run, model.path, dtype, sorted({min(args.users), max(args.users)}), args)
    return run


def run_offline(run: ServerRun, path: str, dtype: str, users: list[int], args) -> None:
    """The server's own engine on the same requests, in a fresh process (lessons/task_15/
    offline.py); a failure is kept as one line, and the rest of the task goes on."""
    print(f"  {run.way} offline, {' and '.join(map(str, users))} users...", end=" ",
          flush=True)
    try:
        found, _ = measure.run_once(f"{run.way} offline", [
            "-m", "lessons.task_15.offline", "--way", run.way, "--model", path, "--dtype", dtype,
            "--users", ",".join(map(str, users)), "--tokens", str(args.max_tokens),
            "--passes", str(args.passes), "--kernels", args.kernels], OFFLINE_TIMEOUT_S)
    except server.ServerError as e:
        run.offline_error = str(e).splitlines()[0][:200]
        print("failed", flush=True)
        report.note(f"  {run.way} offline failed: {run.offline_error}")
        return
    run.offline_startup_s = found["startup_s"]
    run.offline = [Offline(int(n), *(measure.Spread.of(found[what][n]) for what in
                                     ("tokens_per_s", "first_token_s", "step_s")))
                   for n in found["tokens_per_s"]]
    print(", ".join(f"{o.tokens_per_s.median:.1f}" for o in run.offline) + " tok/s", flush=True)


def main(argv: list[str] | None = None) -> ThreeServers:
    args = parse_args(argv)
    report.title("Task 15: Serve the Engine You Built")
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    s = Settings()
    report.run_info(model, dtype, settings.num_cores(), **{
        "Engine settings": f"{s.describe()} (vLLM and mini_engine)"})
    report.row("Load (users x tokens)", f"{', '.join(map(str, args.users))} x "
                                        f"{args.max_tokens}, EOS held off")
    report.row("Passes", f"{args.passes} a level, in turns; median")
    with report.detail():
        report.note("Each level: its users at once, one streamed request each; the levels take "
                    "turns within each server, and the median pass is shown.")
    report.section("MEASURING (one server at a time)")
    runs = []
    for way in args.servers:
        try:
            runs.append(measure_server(way, args, model, dtype.dtype, s))
        except server.ServerError as e:     # one server that cannot run; the rest still do
            first_line = str(e).splitlines()[0]
            report.note(f"{way} did not run: {first_line}")
            runs.append(ServerRun(way, way, skipped=first_line))
    record = ThreeServers(s.describe(), args.users, args.max_tokens, settings.TEMPERATURE,
                          args.passes, runs,
                          header=results.RunHeader.of(model, dtype, settings.num_cores(),
                                                      model.name))
    print_report(record)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sum(lv.num_failed for r in runs for lv in r.levels))
    return record


if __name__ == "__main__":
    cli.run(main)
