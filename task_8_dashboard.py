"""Task 8: Live Monitoring Dashboard.

Watches the lab's vLLM server (reused when one runs, else started; or --base-url) through its
Prometheus endpoint /metrics, the one production scrapes, and serves a Gradio page on :7860 that
refreshes every second: generation tokens/s, requests running and waiting, KV-cache usage, mean
time to first token and end-to-end latency, the prefix cache's hit rate (task 10), with plots of
the last minutes. A button on the page sends N concurrent requests, so you can watch the KV
cache fill and the batch grow and drain. When the server goes down the page says so and picks
up again when it is back. The page and the Monitor behind it are in lessons/task_8/monitor.py,
the snapshot's record in lessons/task_8/record.py, the report's printing and its KEY INSIGHT in
lessons/task_8/report.py; the snapshot's measurement is here.

    python task_8_dashboard.py                  # dashboard on http://127.0.0.1:7860, Ctrl-C stops
    python task_8_dashboard.py --host 0.0.0.0   # on a remote lab VM: reachable from your browser
    python task_8_dashboard.py --once           # one boxed metrics snapshot, then exit
    python task_8_dashboard.py --once --load 20 # the snapshot while 20 requests run (make lab)

It prints a boxed header first (server, engine, a first metrics snapshot, the dashboard URL).
With --once it then reads /metrics over one interval, which starts before --load's first request
so that it counts the whole load, and prints what the server did in it. A server it started
itself it stops again on exit (--keep-server leaves it running); a server it found running it
leaves running.
"""
from __future__ import annotations

import time

import requests

from common import cli, figures, metrics, report, results, server, settings
from lessons.task_8 import FIGURES, monitor
from lessons.task_8 import report as show
from lessons.task_8.record import Dashboard, Interval, LoadSent, Snapshot

SCRIPT = "task_8_dashboard"
LOAD_ADMIT_TIMEOUT_S = 60   # how long --load waits for the server to take all its requests in
READ_EVERY_S = 0.1          # --once reads /metrics this often during its interval


# --- set up --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    group = parser.add_argument_group("dashboard")
    group.add_argument("--port", dest="dashboard_port", type=cli.port_number,
                       default=settings.DASHBOARD_PORT,
                       help=f"port of the dashboard (default {settings.DASHBOARD_PORT})")
    group.add_argument("--host", dest="dashboard_host", default="127.0.0.1",
                       help="address the dashboard listens on (default 127.0.0.1, this machine "
                            "only; 0.0.0.0 to open it from another machine, e.g. a remote lab VM)")
    group.add_argument("--interval", type=float, default=monitor.POLL_INTERVAL_S,
                       help=f"seconds between reads of /metrics "
                            f"(default {monitor.POLL_INTERVAL_S:g})")
    group.add_argument("--once", action="store_true",
                       help="print one metrics snapshot as a boxed report and exit")
    group.add_argument("--load", type=cli.positive_int, default=None, metavar="N",
                       help="with --once: send N concurrent requests (as the page's button does) "
                            "and take the snapshot while they run")
    group.add_argument("--max-tokens", type=cli.positive_int, default=settings.MAX_NEW_TOKENS,
                       help=f"new tokens per request sent from the page (default "
                            f"{settings.MAX_NEW_TOKENS})")
    group = parser.add_argument_group("vLLM server")
    group.add_argument("--base-url", default=None,
                       help="watch this vLLM server (e.g. on a GPU box); the lab then never starts "
                            "or stops one")
    group.add_argument("--server-port", dest="port", type=cli.port_number,
                       default=settings.SERVER_PORT,
                       help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    group.add_argument("--keep-server", action="store_true",
                       help="leave a server this run started running on exit")
    args = parser.parse_args(argv)
    if not 0.2 <= args.interval <= 10:
        parser.error("--interval must be between 0.2 and 10 seconds")
    if args.load and not args.once:
        parser.error("--load goes with --once (on the page, the button sends the load)")
    return args


def watched_server(args):
    """(server, model, dtype): --base-url; else the lab server already running on --server-port,
    whatever its settings (a dashboard watches, it does not restart); else a new one."""
    if not args.base_url:
        running = server.running_server(args.port)
        if running is not None:
            return running, None, None
    return cli.lab_server(args.base_url, args.model, args.dtype, port=args.port)


# --- measure: --once reads /metrics over one interval --------------------------------------------
def read_metrics(srv) -> tuple[str, metrics.Snapshot]:
    """The /metrics text and its snapshot, or one clear line and exit 1 (parsing it is the check
    that it is Prometheus text)."""
    try:
        text = metrics.fetch(srv.base_url)
        return text, metrics.snapshot(text, time.monotonic())
    except (requests.RequestException, ValueError) as e:
        cli.fail(f"{srv.base_url}/metrics cannot be read ({type(e).__name__}); is it a vLLM "
                 f"server, and still running?", code=1)


def read_interval(srv, first: metrics.Snapshot, interval_s: float,
                  sender: monitor.Monitor | None = None, num_requests: int = 0):
    """Reads /metrics from `first` on: with a load (sent after `first`), until the server has
    taken it all in (running + waiting + finished since = N, one running at least), then for
    interval_s more. vLLM looks a prompt up in its prefix cache when it schedules the request,
    so the interval starts at `first`, before the load's first request: begun once the load was
    in, it would count none of its prompts. Returns the last read and the fullest one: the batch
    at its largest (a load of short requests can finish its first wave within the interval, and
    the read after it would show the next wave still being admitted)."""
    last = fullest = first

    def read_after(wait_s: float) -> None:
        nonlocal last, fullest
        time.sleep(max(0.0, wait_s))
        _, last = read_metrics(srv)
        if (last.running, last.waiting) > (fullest.running, fullest.waiting):
            fullest = last

    deadline = time.monotonic() + LOAD_ADMIT_TIMEOUT_S
    while (sender is not None and sender.load_run.is_running and time.monotonic() < deadline
           and not (last.running and last.running + last.waiting + last.e2e_count
                    - first.e2e_count >= num_requests)):
        read_after(READ_EVERY_S)
    deadline = time.monotonic() + interval_s
    while time.monotonic() < deadline:
        read_after(min(READ_EVERY_S, deadline - time.monotonic()))
    return last, fullest


def finish_load(sender: monitor.Monitor, max_tokens: int) -> LoadSent:
    """Waits for the load to end and counts it; one line and exit 1 if it could not be sent."""
    while sender.load_run.is_running:
        time.sleep(0.2)
    run = sender.load_run
    if run.error is not None:
        cli.fail(f"the load could not be sent: {run.error}", code=1)
    return LoadSent.of(run.result, max_tokens)


# --- the lesson, in the order it prints ----------------------------------------------------------
def take_snapshot(args, srv, first: metrics.Snapshot, header, cache: dict) -> Dashboard:
    """--once: the interval from `first` (the load sent after it), printed, explained, saved."""
    sender = monitor.Monitor(srv.base_url, srv.model_name) if args.load else None   # not polled
    if sender:
        sender.send_load(args.load, args.max_tokens)
    last, fullest = read_interval(srv, first, args.interval, sender, args.load or 0)
    window = metrics.window(first, last)
    interval, snapshot = Interval.of(window) if window else None, Snapshot.of(last, fullest)
    show.print_interval(interval, snapshot, args.load)
    sent = finish_load(sender, args.max_tokens) if sender else None
    if sent:
        show.print_load(sent)
    record = Dashboard(srv.base_url, srv.state, cache, snapshot, header=header, load=sent,
                       engine=srv.config.describe() if srv.config else None,
                       last_interval=interval)
    report.insight(show.insight_lines(snapshot, interval.tokens_per_s if interval else None,
                                 srv.config.max_num_seqs if srv.config else None))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sent.num_failed if sent else 0)
    return record


def main(argv: list[str] | None = None) -> Dashboard | None:
    """--once: the snapshot's record; the live page: None, when it stops."""
    args = parse_args(argv)
    if not args.once and server.port_in_use(args.dashboard_host, args.dashboard_port):
        cli.fail(f"port {args.dashboard_port} is in use (another dashboard?); stop it or choose "
                 f"another --port", code=1)
    srv, model, dtype = watched_server(args)
    owned = srv.state in ("started", "restarted") and not args.keep_server
    try:
        text, first = read_metrics(srv)
        cache = metrics.info_labels(text, "vllm:cache_config_info")
        show.print_header(srv, model, dtype, first, cache)
        if not args.once:
            url = show.print_dashboard(args)
            return monitor.serve(srv, args.dashboard_host, args.dashboard_port, url,
                                 args.interval, args.max_tokens, show.engine_line(srv, cache))
        header = results.RunHeader(
            srv.model_name, model.source if model else None, model.path if model else None,
            dtype.dtype if dtype else (srv.config.dtype if srv.config else None),
            dtype.reason if dtype else None, settings.num_cores())
        return take_snapshot(args, srv, first, header, cache)
    finally:
        if owned:
            stopped = server.stop_server(args.port)
            print(f"Stopped the vLLM server this run started on :{args.port}." if stopped else
                  f"The vLLM server this run started on :{args.port} had already stopped.")


if __name__ == "__main__":
    cli.run(main)
