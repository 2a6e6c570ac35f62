"""Task 8's live page: the Monitor that watches a vLLM server's /metrics, then the page over it.

The Monitor is plain Python and does the work: it polls /metrics in the background, keeps a
short history, turns it into the figures and time series the page shows, and sends a burst of
concurrent requests on demand (task_8_dashboard.py --once --load N sends its load through it
too). The page (build_ui) is thin Gradio wiring over it, as in vLLM's Gradio example: what a
table row or a plot shows is worked out by plain functions (table_rows, plot_frame) that tests
call without a browser.

Rates and means come from differences of snapshots (see common.metrics): tokens/s over the last
poll interval, mean TTFT and end-to-end latency over the requests of the last latency window
(completions are sparse, so one second would mostly show nothing).
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass

import requests

from common import load, metrics
from common.poller import Poller

POLL_INTERVAL_S = 1.0      # one read of /metrics per second: the page refreshes as often
LATENCY_WINDOW_S = 10.0    # mean TTFT / latency over requests of the last 10 s
HISTORY_S = 180.0          # the plots show the last 3 minutes


@dataclass(frozen=True)
class Point:
    """One poll, ready to plot: t_s is seconds since the dashboard started."""
    t_s: float
    tokens_per_s: float | None     # None right after a (re)start: nothing to compare with
    running: int
    waiting: int
    kv_usage_pct: float | None     # None: the server does not export it
    mean_ttft_s: float | None
    mean_e2e_s: float | None
    prefix_hit_pct: float | None = None   # prompt tokens found in the prefix cache, since the
                                          # server started (None: none looked up yet)


@dataclass
class LoadRun:
    """A burst of concurrent requests sent from the page (or by --once --load)."""
    num_requests: int
    started_s: float
    result: load.LoadLevel | None = None   # what load.run_level returned, once it has
    error: str | None = None          # the load itself broke (not a request: those are counted)

    @property
    def is_running(self) -> bool:
        return self.result is None and self.error is None

    def describe(self, now_s: float) -> str:
        if self.error is not None:
            return f"The load failed: {self.error}"
        if self.result is None:
            return (f"Sending {self.num_requests} concurrent requests... "
                    f"({now_s - self.started_s:.0f} s so far)")
        r = self.result
        text = (f"Last load: {r.num_ok}/{r.num_users} requests ok in {r.duration_s:.1f} s, "
                f"{r.num_output_tokens:,} tokens, {r.tokens_per_s:.1f} tok/s measured by the "
                f"client, mean latency {r.mean_latency_s or 0.0:.2f} s")
        return text + (f"; failed: {r.errors[0]}" if r.errors else "")


class Monitor(Poller):
    """Polls base_url/metrics every interval_s in a background thread (start/stop)."""

    def __init__(self, base_url: str, model_name: str, interval_s: float = POLL_INTERVAL_S,
                 latency_window_s: float = LATENCY_WINDOW_S, history_s: float = HISTORY_S):
        super().__init__(interval_s)
        self.base_url = base_url
        self.model_name = model_name
        self.latency_window_s = latency_window_s
        self.history_s = history_s
        self.started_s = time.monotonic()
        self.snapshots: deque[metrics.Snapshot] = deque()   # since the server's last (re)start
        self.points: deque[Point] = deque()
        self.error: str | None = None          # why the last poll failed; None when it worked
        self.down_since_s: float | None = None
        self.last_ok_s: float | None = None
        self.num_restarts_seen = 0
        self.load_run: LoadRun | None = None
        self._lock = threading.Lock()

    # --- polling ---------------------------------------------------------------------------
    def poll(self) -> None:
        """Read /metrics once; a failure is remembered (the server is down), never raised."""
        now = time.monotonic()
        try:
            snap = metrics.snapshot(metrics.fetch(self.base_url, timeout=2), now)
        except (requests.RequestException, ValueError) as e:
            with self._lock:
                self.error = type(e).__name__
                self.down_since_s = self.down_since_s or now
            return
        with self._lock:
            self.error, self.down_since_s, self.last_ok_s = None, None, now
            if self.snapshots and metrics.window(self.snapshots[-1], snap) is None:
                self.snapshots.clear()            # counters went back: the server restarted
                self.num_restarts_seen += 1
            self.snapshots.append(snap)
            while now - self.snapshots[0].time_s > self.history_s:
                self.snapshots.popleft()
            self.points.append(self._point(snap))
            while self.points and now - self.started_s - self.points[0].t_s > self.history_s:
                self.points.popleft()

    def _point(self, snap: metrics.Snapshot) -> Point:
        last = metrics.window(self.snapshots[-2], snap) if len(self.snapshots) > 1 else None
        # the oldest snapshot still inside the latency window (or the oldest there is)
        start = next((s for s in self.snapshots if snap.time_s - s.time_s <= self.latency_window_s),
                     snap)
        recent = metrics.window(start, snap) if start is not snap else None
        return Point(t_s=snap.time_s - self.started_s,
                     tokens_per_s=last.tokens_per_s if last else None,
                     running=snap.running, waiting=snap.waiting,
                     kv_usage_pct=None if snap.kv_usage is None else 100 * snap.kv_usage,
                     mean_ttft_s=recent.mean_ttft_s if recent else None,
                     mean_e2e_s=recent.mean_e2e_s if recent else None,
                     prefix_hit_pct=None if snap.prefix_hit_rate is None
                     else 100 * snap.prefix_hit_rate)

    # --- what the page shows ---------------------------------------------------------------
    def is_down(self) -> bool:
        with self._lock:
            return self.error is not None

    def latest(self) -> Point | None:
        with self._lock:
            return self.points[-1] if self.points else None

    def history(self) -> list[Point]:
        with self._lock:
            return list(self.points)

    def status(self) -> str:
        now = time.monotonic()
        with self._lock:
            if self.error is not None:
                return (f"Server DOWN: {self.base_url}/metrics is not answering ({self.error}) "
                        f"for {now - self.down_since_s:.0f} s; retrying every "
                        f"{self.interval_s:g} s, the dashboard keeps running.")
            if self.last_ok_s is None:
                return f"Connecting to {self.base_url}/metrics..."
            restarts = (f" (saw {self.num_restarts_seen} server restart(s))"
                        if self.num_restarts_seen else "")
            return (f"Server UP: {self.base_url}, model {self.model_name}; /metrics read "
                    f"{now - self.last_ok_s:.1f} s ago{restarts}.")

    # --- load from the page ----------------------------------------------------------------
    def send_load(self, num_requests: int, max_tokens: int) -> str:
        """Start num_requests concurrent requests in the background; returns what it did."""
        with self._lock:
            if self.load_run is not None and self.load_run.is_running:
                return "A load is still running; wait for it to finish."
            run = self.load_run = LoadRun(num_requests, time.monotonic())

        def send() -> None:
            try:
                result = load.run_level(self.base_url, self.model_name,
                                        load.user_prompts(num_requests), max_tokens)
            except Exception as e:  # noqa: BLE001 - the page must learn of it, not hang
                with self._lock:
                    run.error = f"{type(e).__name__}: {e}"[:200]
                return
            with self._lock:
                run.result = result

        threading.Thread(target=send, daemon=True).start()
        return run.describe(time.monotonic())

    def load_status(self) -> str:
        with self._lock:
            run = self.load_run
        return run.describe(time.monotonic()) if run else "No load sent yet."


# --- the page: what it shows, in plain functions -------------------------------------------------
def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table_rows(watcher: Monitor) -> list[tuple[str, object]]:
    """The figures table of the page: (label with its unit, value now); [] before any read."""
    p = watcher.latest()
    if p is None:
        return []
    window = f"last {watcher.latency_window_s:g} s"
    return [("Generation tokens/s (last interval)", _number(p.tokens_per_s, 1)),
            ("Requests running", p.running), ("Requests waiting", p.waiting),
            ("KV-cache usage (%)", "n/a" if p.kv_usage_pct is None else f"{p.kv_usage_pct:.1f}"),
            (f"Mean TTFT, {window} (s)", _number(p.mean_ttft_s, 3)),
            (f"Mean e2e latency, {window} (s)", _number(p.mean_e2e_s, 3)),
            ("Prefix-cache hit rate since start (%)", _number(p.prefix_hit_pct, 1))]


def table_markdown(watcher: Monitor) -> str:
    rows = table_rows(watcher)
    if not rows:
        return "No metrics read yet."
    now = "Last read (server down)" if watcher.is_down() else "Now"
    return f"| Metric | {now} |\n|---|---:|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


PLOT_COLUMNS = {"t (s)": "float64", "value": "float64", "series": "str"}
# each plot's series -> the Point attribute it plots
PLOTS = {"tokens": {"tokens/s": "tokens_per_s"},
         "requests": {"running": "running", "waiting": "waiting"},
         "kv": {"KV-cache %": "kv_usage_pct"},
         "latency": {"TTFT": "mean_ttft_s", "e2e": "mean_e2e_s"}}


def plot_frame(points: list[Point], columns: dict[str, str]):
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


# --- the page: the Gradio wiring, and serving it -------------------------------------------------
def build_ui(watcher: Monitor, max_tokens: int, refresh_s: float, engine: str):
    """The page: thin Gradio wiring over the Monitor and the functions above."""
    import gradio as gr

    def refresh():
        points = watcher.history()
        plots = [plot_frame(points, columns) for columns in PLOTS.values()]
        # a plot with no value yet keeps waiting for its first real frame (see plot_frame)
        plots = [frame if frame["value"].notna().any() else gr.skip() for frame in plots]
        return (watcher.status(), table_markdown(watcher), watcher.load_status(), *plots)

    def plot(title: str, y_title: str) -> gr.LinePlot:
        return gr.LinePlot(x="t (s)", y="value", color="series", title=title, y_title=y_title,
                           x_title="seconds since the dashboard started", height=260)

    with gr.Blocks(title="vLLM lab: live dashboard") as demo:
        gr.Markdown(f"# vLLM live dashboard\nWatching `{watcher.base_url}/metrics` "
                    f"(model {watcher.model_name}), read every {refresh_s:g} s. {engine}")
        status = gr.Markdown(watcher.status(), elem_id="status")
        table = gr.Markdown(table_markdown(watcher), elem_id="figures")
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


def serve(srv, host: str, port: int, url: str, interval_s: float, max_tokens: int,
          engine: str) -> None:
    """Watch srv and serve the page on host:port until Ctrl-C (or SIGTERM: cli.run takes it as
    Ctrl-C)."""
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")   # no calls home: offline lab
    watcher = Monitor(srv.base_url, srv.model_name, interval_s=interval_s).start()
    demo = build_ui(watcher, max_tokens, refresh_s=interval_s, engine=engine)
    try:
        demo.launch(server_name=host, server_port=port, prevent_thread_lock=True, quiet=True,
                    show_error=True)
        print(f"Serving the dashboard on {url}; press Ctrl-C to stop.", flush=True)
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("\nStopping the dashboard.", flush=True)
    finally:
        demo.close()
        watcher.stop()
