"""Task 8: Live Monitoring Dashboard.

Watches the lab's vLLM server (reused when one runs, else started; or --base-url) through its
Prometheus endpoint /metrics, the one production scrapes, and serves a Gradio page on :7860 that
refreshes every second: generation tokens/s, requests running and waiting, KV-cache usage, mean
time to first token and end-to-end latency, the prefix cache's hit rate (task 10), with plots of
the last minutes. A button on the page
sends N concurrent requests, so you can watch the KV cache fill and the batch grow and drain.
When the server goes down the page says so and picks up again when it is back.

    python task_8_dashboard.py                  # dashboard on http://127.0.0.1:7860, Ctrl-C stops
    python task_8_dashboard.py --host 0.0.0.0   # on a remote lab VM: reachable from your browser
    python task_8_dashboard.py --once           # one boxed metrics snapshot, then exit
    python task_8_dashboard.py --once --load 20 # the snapshot while 20 requests run (make lab)

It prints a boxed header first (server, engine, a first metrics snapshot, the dashboard URL).
A server it started itself it stops again on exit (--keep-server leaves it running); a server
it found running it leaves running.
"""
from __future__ import annotations

import os
import socket
import time

import requests

from common import cli, figures, metrics, monitor, report, results, server, settings

SCRIPT = "task_8_dashboard"


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
                       help=f"seconds between reads of /metrics (default {monitor.POLL_INTERVAL_S:g})")
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


def print_header(srv, model, dtype, snap: metrics.Snapshot, cache_labels: dict) -> None:
    """What is watched, and the first snapshot."""
    report.title("Task 8: Live Monitoring Dashboard")
    if model:
        report.run_info(model, dtype, settings.num_cores(), Engine=srv.config.describe())
    else:   # a server found running: what it was started with
        report.row("Model", srv.model_name)
        if srv.config:
            report.row("  path", srv.config.model_path)
            report.row("dtype", srv.config.dtype)
            report.row("Threads (cores used)", settings.num_cores())
            report.row("Engine", srv.config.describe())
    state = {"external": "external (--base-url): not started or stopped here",
             "reused": f"already running (PID {srv.pid}): left running on exit"}
    report.row("Server", f"{srv.base_url}, " + state.get(srv.state, f"{srv.state} (PID {srv.pid})"))
    cache = describe_cache(cache_labels)
    if cache:
        report.row("KV cache (from /metrics)", cache)
    report.section(f"METRICS SNAPSHOT: {srv.base_url}/metrics")
    report.row("Generation tokens since start", f"{snap.generation_tokens:,.0f}")
    report.row("Requests finished since start", f"{snap.e2e_count:,.0f}")
    report.row("Requests running / waiting", f"{snap.running} / {snap.waiting}")
    report.row("KV-cache usage (%)", _percent(snap.kv_usage))
    report.row("Mean TTFT since start (s)", _seconds(snap.mean_ttft_s))
    report.row("Mean e2e latency since start (s)", _seconds(snap.mean_e2e_s))
    report.row("Preemptions since start", f"{snap.preemptions:,.0f}")
    report.row("Prefix-cache hit rate since start (%)", _hit_rate(snap.prefix_hit_rate,
                                                                  snap.prefix_queries))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _hit_rate(rate: float | None, queries: float | None = None) -> str:
    """Prompt tokens found in vLLM's prefix cache (vllm:prefix_cache_hits / _queries)."""
    if rate is None:
        return "- (no prompt looked up)"
    return f"{100 * rate:.1f}" + (f" (of {queries:,.0f} prompt tokens)" if queries else "")


def _percent(fraction: float | None) -> str:
    return "n/a (not exported by this server)" if fraction is None else f"{100 * fraction:.1f}"


def describe_cache(labels: dict) -> str:
    """vllm:cache_config_info in words. The engine's token figure is its max concurrency times
    max_model_len, not blocks x block size (45 blocks x 128 = 5,760 slots hold 45 requests of
    max_model_len 64: 2,880 tokens), so the two are printed apart."""
    parts = []
    if labels.get("num_gpu_blocks") not in (None, "None") and labels.get("block_size"):
        parts.append(f"{labels['num_gpu_blocks']} blocks of {labels['block_size']} tokens")
    if labels.get("kv_cache_size_tokens") and labels.get("kv_cache_max_concurrency"):
        parts.append(f"engine: {int(labels['kv_cache_size_tokens']):,} tokens, "
                     f"{float(labels['kv_cache_max_concurrency']):.2f}x requests at max_model_len")
    return "; ".join(parts)


def snapshot_once(args, srv, first: metrics.Snapshot, title: str = "") -> dict:
    """--once: a second read after one interval gives the rates of right now. The batch (running,
    waiting, KV-cache usage) is read at its fullest during the interval: a load of short requests
    can finish its first wave within one interval, and the read after it would show the next
    wave still being admitted."""
    second, busiest = first, first
    deadline = time.monotonic() + args.interval
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        _, second = read_metrics(srv)
        if (second.running, second.waiting) > (busiest.running, busiest.waiting):
            busiest = second
    now = metrics.window(first, second)
    report.section(f"{title}LAST {now.seconds:.1f} s" if now else f"{title}LAST INTERVAL")
    if now is None:
        report.note("The server restarted between the two reads; run again.")
    else:
        report.row("Generation tokens/s", f"{now.tokens_per_s:.1f}")
        report.row("Requests running / waiting", f"{busiest.running} / {busiest.waiting}")
        report.row("KV-cache usage (%)", _percent(busiest.kv_usage))
        report.row("Prefix-cache hit rate (%)", _hit_rate(now.prefix_hit_rate))
    snapshot = {k: v for k, v in vars(second).items() if k != "time_s"}   # a monotonic clock
    snapshot |= {"running": busiest.running, "waiting": busiest.waiting,
                 "kv_usage": busiest.kv_usage}
    return {"snapshot": snapshot | {"mean_ttft_s": second.mean_ttft_s,
                                    "mean_e2e_s": second.mean_e2e_s},
            "last_interval": vars(now) if now else None}


LOAD_ADMIT_TIMEOUT_S = 60   # how long --load waits for the server to take all its requests in


def snapshot_under_load(args, srv, first: metrics.Snapshot) -> dict:
    """--once --load N: send N concurrent requests in the background (the page's button), wait
    until the server has taken all N in (running + waiting + finished since = N, one running at
    least), then take the snapshot of one interval while they run; then wait for the load and
    count it."""
    sender = monitor.Monitor(srv.base_url, srv.model_name)   # used for its load, not polled
    sender.send_load(args.load, args.max_tokens)
    deadline = time.monotonic() + LOAD_ADMIT_TIMEOUT_S
    while True:
        _, snap = read_metrics(srv)
        taken_in = snap.running + snap.waiting + snap.e2e_count - first.e2e_count
        if (snap.running and taken_in >= args.load) or time.monotonic() > deadline \
                or not sender.load_run.is_running:
            break
        time.sleep(0.1)
    data = snapshot_once(args, srv, snap, title=f"{args.load} REQUESTS SENT, ")
    while sender.load_run.is_running:
        time.sleep(0.2)
    run = sender.load_run
    if run.error is not None:
        cli.fail(f"the load could not be sent: {run.error}", code=1)
    r = run.result
    report.row("The load, when it finished", f"{len(r.ok)}/{r.num_users} requests ok in "
                                             f"{r.duration_s:.1f} s, {r.total_tokens:,} tokens")
    for error in r.errors:
        report.note(f"failed: {error}", indent=2)
    return data | {"load": {"sent": r.num_users, "succeeded": len(r.ok), "failed": r.num_failed,
                            "max_tokens": args.max_tokens, "total_tokens": r.total_tokens,
                            "duration_s": round(r.duration_s, 2)}}


def read_metrics(srv) -> tuple[str, metrics.Snapshot]:
    """The /metrics text and its snapshot, or one clear line and exit 1 (parsing it is the check
    that it is Prometheus text)."""
    try:
        text = metrics.fetch(srv.base_url)
        return text, metrics.snapshot(text, time.monotonic())
    except (requests.RequestException, ValueError) as e:
        cli.fail(f"{srv.base_url}/metrics cannot be read ({type(e).__name__}); is it a vLLM "
                 f"server, and still running?", code=1)


PRODUCTION = "Production watches these same /metrics: Prometheus scrapes them, Grafana plots them"
KV_FULL = 0.9   # KV-cache usage from which the cache, not max_num_seqs, is taken as the cap


def insight_lines(snap: dict, tokens_per_s: float | None, max_num_seqs: int | None) -> list[str]:
    """The KEY INSIGHT of a snapshot, chosen from what it shows: the batch, what waited, and
    which limit (max_num_seqs or the KV cache) held the others back."""
    if not snap["running"]:
        return [PRODUCTION, "The server was idle at the snapshot (0 requests running): nothing "
                            "to batch; --once --load N takes it while N requests run"]
    kv = None if snap["kv_usage"] is None else f"{100 * snap['kv_usage']:.1f}%"
    rate = f" at {tokens_per_s:.1f} tok/s" if tokens_per_s is not None else ""
    lines = [PRODUCTION, f"{snap['running']} requests ran as one batch{rate}: each engine step "
                         f"made a token for every one of them"]
    if not snap["waiting"]:
        lines.append(f"None waited: all {snap['running']} fit"
                     + (f", in {kv} of the KV cache" if kv else ""))
    elif max_num_seqs and snap["running"] >= max_num_seqs:
        lines.append(f"max_num_seqs={max_num_seqs} capped the batch: {snap['running']} ran, "
                     f"{snap['waiting']} waited"
                     + (f", with the KV cache {kv} full: not the memory" if kv else ""))
    elif kv and snap["kv_usage"] >= KV_FULL:
        lines.append(f"The KV cache was {kv} full: the memory capped the batch, "
                     f"{snap['waiting']} waited")
    else:
        lines.append(f"{snap['waiting']} waited, with {snap['running']} running"
                     + (f" and the KV cache {kv} full" if kv else ""))
    return lines


def live_insight() -> None:
    """The live page's header: nothing is measured yet, so what to look for, not a finding."""
    report.insight([PRODUCTION, "Send requests from the page and watch running, waiting and "
                                "KV-cache usage: whichever limit is reached first (max_num_seqs, "
                                "or the KV cache at 100%) makes the rest wait"])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not args.once and server.port_in_use(args.dashboard_host, args.dashboard_port):
        cli.fail(f"port {args.dashboard_port} is in use (another dashboard?); stop it or choose "
                 f"another --port", code=1)
    srv, model, dtype = watched_server(args)
    owned = srv.state in ("started", "restarted") and not args.keep_server
    try:
        text, first = read_metrics(srv)
        cache_labels = metrics.info_labels(text, "vllm:cache_config_info")
        print_header(srv, model, dtype, first, cache_labels)
        header = results.RunHeader(
            srv.model_name, model.source if model else None, model.path if model else None,
            dtype.dtype if dtype else (srv.config.dtype if srv.config else None),
            dtype.reason if dtype else None, settings.num_cores())
        data = {"base_url": srv.base_url,
                "server_state": srv.state,
                "engine": srv.config.describe() if srv.config else None,
                "cache_config": cache_labels}
        if args.once:
            data |= (snapshot_under_load(args, srv, first) if args.load
                     else snapshot_once(args, srv, first))
            interval = data["last_interval"]
            report.insight(insight_lines(data["snapshot"],
                                         interval["tokens_per_s"] if interval else None,
                                         srv.config.max_num_seqs if srv.config else None))
            figures.saved(results.save(SCRIPT, header, results.Dashboard.from_dict(data)))
            cli.fail_if_any_failed((data.get("load") or {}).get("failed", 0))
            return header.__dict__ | data
        serve_dashboard(args, srv, data["cache_config"])
        return data
    finally:
        if owned:
            stopped = server.stop_server(args.port)
            print(f"Stopped the vLLM server this run started on :{args.port}." if stopped else
                  f"The vLLM server this run started on :{args.port} had already stopped.")


def build_ui(watcher: monitor.Monitor, max_tokens: int, refresh_s: float, engine: str):
    """The page: thin Gradio wiring over the Monitor, which does the work."""
    import gradio as gr

    def figures() -> str:
        p = watcher.latest()
        if p is None:
            return "No metrics read yet."
        rows = [("Generation tokens/s (last interval)", _rate(p.tokens_per_s)),
                ("Requests running", p.running), ("Requests waiting", p.waiting),
                ("KV-cache usage (%)", "n/a" if p.kv_usage_pct is None else f"{p.kv_usage_pct:.1f}"),
                (f"Mean TTFT, last {watcher.latency_window_s:g} s (s)", _seconds(p.mean_ttft_s)),
                (f"Mean e2e latency, last {watcher.latency_window_s:g} s (s)",
                 _seconds(p.mean_e2e_s)),
                ("Prefix-cache hit rate since start (%)",
                 "-" if p.prefix_hit_pct is None else f"{p.prefix_hit_pct:.1f}")]
        now = "Last read (server down)" if watcher.is_down() else "Now"
        return f"| Metric | {now} |\n|---|---:|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)

    def refresh():
        points = watcher.history()
        plots = [plot_frame(points, {"tokens/s": "tokens_per_s"}),
                 plot_frame(points, {"running": "running", "waiting": "waiting"}),
                 plot_frame(points, {"KV-cache %": "kv_usage_pct"}),
                 plot_frame(points, {"TTFT": "mean_ttft_s", "e2e": "mean_e2e_s"})]
        # a plot with no value yet keeps waiting for its first real frame (see plot_frame)
        plots = [frame if frame["value"].notna().any() else gr.skip() for frame in plots]
        return (watcher.status(), figures(), watcher.load_status(), *plots)

    def plot(title: str, y_title: str) -> gr.LinePlot:
        return gr.LinePlot(x="t (s)", y="value", color="series", title=title, y_title=y_title,
                           x_title="seconds since the dashboard started", height=260)

    with gr.Blocks(title="vLLM lab: live dashboard") as demo:
        gr.Markdown(f"# vLLM live dashboard\nWatching `{watcher.base_url}/metrics` "
                    f"(model {watcher.model_name}), read every {refresh_s:g} s. {engine}")
        status = gr.Markdown(watcher.status(), elem_id="status")
        table = gr.Markdown(figures(), elem_id="figures")
        with gr.Row():
            num_requests = gr.Slider(1, 100, value=20, step=1, label="Concurrent requests",
                                     elem_id="num-requests")
            send = gr.Button(f"Send concurrent requests ({max_tokens} tokens each)",
                             variant="primary", elem_id="send-load")
        load_status = gr.Markdown(watcher.load_status(), elem_id="load-status")
        with gr.Row():
            tokens_plot = plot("Generation throughput", "tokens/s")
            requests_plot = plot("Requests", "requests")
        with gr.Row():
            kv_plot = plot("KV-cache usage", "%")
            latency_plot = plot(f"Mean latency, last {watcher.latency_window_s:g} s", "seconds")
        gr.Markdown("Production scrapes the same `/metrics` with Prometheus and plots it in "
                    "Grafana; the names are `vllm:generation_tokens_total`, "
                    "`vllm:num_requests_running`, `vllm:num_requests_waiting`, "
                    "`vllm:kv_cache_usage_perc`, `vllm:time_to_first_token_seconds`, "
                    "`vllm:e2e_request_latency_seconds`.")
        send.click(lambda n: watcher.send_load(int(n), max_tokens), inputs=num_requests,
                   outputs=load_status)
        gr.Timer(refresh_s).tick(refresh, outputs=[status, table, load_status, tokens_plot,
                                                   requests_plot, kv_plot, latency_plot])
    return demo


PLOT_COLUMNS = {"t (s)": "float64", "value": "float64", "series": "str"}


def plot_frame(points: list[monitor.Point], columns: dict[str, str]):
    """One plot's data in long form (t (s), value, series), from the Monitor's points; columns
    maps each series to the Point attribute it plots.

    Gradio's plot builds its axes, their margins and its colour scale once, from the first frame
    it gets, and then only swaps the data. So the columns are typed, every series is in every
    frame (NaN where it has no value yet: not drawn), and the page sends a plot no frame before
    it has a value: a first frame with no rows (no request finished yet) had untyped columns,
    and the latency plot kept text axes (x ticks '14.179066998', y labels cut) and no colour for
    its lines, so none showed."""
    import pandas as pd

    rows = [(p.t_s, getattr(p, attr), name) for p in points for name, attr in columns.items()]
    return pd.DataFrame(rows, columns=list(PLOT_COLUMNS)).astype(PLOT_COLUMNS)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def engine_line(srv, cache: dict) -> str:
    """The engine's settings and KV capacity, for the page."""
    parts = [f"Engine: {srv.config.describe()}."] if srv.config else []
    if describe_cache(cache):
        parts.append(f"KV cache: {describe_cache(cache)}.")
    return " ".join(parts)


def serve_dashboard(args, srv, cache: dict) -> None:
    """Serve the page until Ctrl-C (or SIGTERM: cli.run takes it as Ctrl-C)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # no calls home: offline lab
    url = f"http://{'127.0.0.1' if args.dashboard_host == '0.0.0.0' else args.dashboard_host}:" \
          f"{args.dashboard_port}"
    report.section("DASHBOARD")
    report.row("Dashboard URL", url)
    if args.dashboard_host == "0.0.0.0":
        report.row("  from another machine", f"http://{socket.gethostname()}:"
                                             f"{args.dashboard_port} (or this machine's address)")
    report.row("Refresh", f"every {args.interval:g} s; latency means over the last "
                          f"{monitor.LATENCY_WINDOW_S:g} s")
    report.row("Load button", f"N concurrent requests of {args.max_tokens} tokens each")
    live_insight()

    watcher = monitor.Monitor(srv.base_url, srv.model_name, interval_s=args.interval).start()
    demo = build_ui(watcher, args.max_tokens, refresh_s=args.interval,
                    engine=engine_line(srv, cache))
    try:
        demo.launch(server_name=args.dashboard_host, server_port=args.dashboard_port,
                    prevent_thread_lock=True, quiet=True, show_error=True)
        print(f"Serving the dashboard on {url}; press Ctrl-C to stop.", flush=True)
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nStopping the dashboard.", flush=True)
    finally:
        demo.close()
        watcher.stop()


if __name__ == "__main__":
    cli.run(main)
