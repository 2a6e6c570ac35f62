"""The dashboard's logic, apart from its Gradio wiring: poll a vLLM server's /metrics in the
background, keep a short history, turn it into the figures and time series the page shows, and
send a burst of concurrent requests on demand.

Rates and means come from differences of snapshots (see common.metrics): tokens/s over the last
poll interval, mean TTFT and end-to-end latency over the requests of the last latency window
(completions are sparse, so one second would mostly show nothing).
"""
from __future__ import annotations

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
    """A burst of concurrent requests sent from the page."""
    num_requests: int
    started_s: float
    result: load.LevelResult | None = None
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
        text = (f"Last load: {len(r.ok)}/{r.num_users} requests ok in {r.duration_s:.1f} s, "
                f"{r.total_tokens:,} tokens, {r.throughput:.1f} tok/s measured by the client, "
                f"mean latency {r.latency_stat('latency_s'):.2f} s")
        errors = r.errors
        return text + (f"; failed: {errors[0]}" if errors else "")


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
