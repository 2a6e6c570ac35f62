"""Task 8: the metrics parsing on /metrics texts captured from the real lab server (idle, with 12
requests running, after they finished), its record and summary row, the Monitor
(lessons/task_8/monitor.py) against a real HTTP endpoint that goes down and comes back, `--once`
(its interval counting the load it reports), and the page itself in a real headless Chromium against a real vLLM
server on the tiny model that the dashboard starts: load sent from the page, figures rising,
the server stopped when the dashboard stops. On the real model, in the lab's quick run (the
lab_run fixture, tests/conftest.py): `--once` under load on the server task 7 left (the last
test here)."""
from __future__ import annotations

import dataclasses
import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from common import metrics, results, server, settings
from lessons.task_8 import monitor
from lessons.task_8 import report as task_8_report
from tests.helpers import (REPO, PipeReader, assert_fits, assert_says, chromium,
                           processes_on_port, run_script, saved_result)

DATA = REPO / "tests" / "data"     # /metrics texts captured from the real lab server
BEFORE, BUSY, AFTER = ((DATA / f"metrics_{n}.txt").read_text() for n in ("before", "busy", "after"))


# --- parsing: exact values from the captured texts -------------------------------------------
def test_snapshot_reads_the_watched_figures():
    busy = metrics.snapshot(BUSY, time_s=1.5)
    assert busy == metrics.Snapshot(time_s=1.5, generation_tokens=365.0, running=12, waiting=0,
                                    kv_usage=0.2727272727272727, ttft_sum_s=2.0723021030426025,
                                    ttft_count=14.0, e2e_sum_s=4.464751720428467, e2e_count=2.0,
                                    preemptions=0.0, prefix_queries=142.0, prefix_hits=0.0,
                                    itl_sum_s=19.837620946001607, itl_count=351.0)
    assert busy.mean_e2e_s == 4.464751720428467 / 2
    # the engine core's mean inter-token latency between two reads: 335 gaps in 20.79 s
    after = metrics.snapshot(AFTER, time_s=3.0)
    assert metrics.engine_itl_s(busy, after) == (40.630400282999744 - 19.837620946001607) / 335
    assert metrics.engine_itl_s(None, after) is None and metrics.engine_itl_s(after, busy) is None
    assert busy.prefix_hit_rate == 0.0      # 142 prompt tokens looked up, none found: the lab's
                                            # user prompts share no whole block of 16


@pytest.mark.parametrize("running, waiting, usage, rate, seqs", [
    (0, 0, 0.0, 0.0, 8), (8, 12, 0.364, 176.4, 8), (44, 56, 1.0, 1260.0, 256),
    (20, 0, 0.455, 150.0, 256), (3, 2, None, None, None), (3, 2, 0.5, None, None),
    (8, 12, None, 176.4, 8)])
def test_the_insight_keeps_its_limits(running, waiting, usage, rate, seqs, capsys):
    """Every branch of the KEY INSIGHT: at most report.MAX_INSIGHT_BULLETS whole sentences in
    report.MAX_INSIGHT_LINES printed lines."""
    from common import report
    from lessons.task_8.record import Snapshot

    read = metrics.Snapshot(0.0, 0.0, running, waiting, usage, 0.0, 0.0, 0.0, 0.0, 0.0)
    lines = task_8_report.insight_lines(Snapshot.of(read, read), rate, seqs)
    report.insight(lines)
    out = capsys.readouterr().out.splitlines()
    printed = out[out.index("KEY INSIGHT:") + 1:-1]
    assert len(lines) <= report.MAX_INSIGHT_BULLETS and len(printed) <= report.MAX_INSIGHT_LINES
    assert all(line.endswith(".") for line in lines), lines


def test_window_is_the_difference_of_two_snapshots():
    before, busy, after = (metrics.snapshot(t, s) for t, s in ((BEFORE, 0.0), (BUSY, 1.5),
                                                                (AFTER, 3.2)))
    w = metrics.window(before, busy)
    assert (w.generation_tokens, w.tokens_per_s) == (265.0, 265.0 / 1.5)
    assert (w.num_first_tokens, w.num_finished, w.mean_e2e_s) == (12, 0, None)
    assert w.mean_ttft_s == (2.0723021030426025 - 0.1169729232788086) / 12
    assert w.prefix_hit_rate == 0.0         # 142 - 14 = 128 tokens looked up, 0 hits
    assert (w.prefix_queries, w.prefix_hits) == (128.0, 0.0)
    later = dataclasses.replace(busy, time_s=2.0)     # no prompt looked up in between
    assert metrics.window(busy, later).prefix_hit_rate is None
    w = metrics.window(before, after)
    assert (w.generation_tokens, w.num_finished) == (600.0, 12)   # 12 requests x 50 tokens
    assert w.mean_e2e_s == (42.69904637336731 - 4.464751720428467) / 12


def test_a_restart_between_snapshots_gives_no_window():
    assert metrics.window(metrics.snapshot(AFTER, 0.0), metrics.snapshot(BEFORE, 1.0)) is None
    assert metrics.window(metrics.snapshot(BEFORE, 1.0), metrics.snapshot(BEFORE, 1.0)) is None


def test_cache_config_labels_are_the_engines():
    cache = metrics.info_labels(AFTER, "vllm:cache_config_info")
    assert (cache["kv_cache_size_tokens"], cache["num_gpu_blocks"], cache["block_size"],
            cache["kv_cache_max_concurrency"]) == ("5760", "45", "128", "45.0")


def test_kv_capacity_is_described_without_a_false_equation():
    a = metrics.info_labels(AFTER, "vllm:cache_config_info")
    # the blocks and the engine's own tokens, each as the labels give it, never one derived
    # from the other (45 x 128 = 5,760 here, by chance)
    assert_says(task_8_report.describe_cache(a), "45 blocks of 128 tokens", "5,760 tokens",
                "45.00x")
    # task 7's config B (max_model_len 64): the same 45 blocks, 2,880 tokens, 45 requests
    b = a | {"kv_cache_size_tokens": "2880"}
    assert_says(task_8_report.describe_cache(b), "45 blocks of 128 tokens", "2,880 tokens",
                "45.00x", not_branch="5,760")
    # a part whose labels are missing is left out, not printed as None
    assert_says(task_8_report.describe_cache(a | {"num_gpu_blocks": "None"}), "5,760 tokens",
                not_branch="blocks of")
    assert task_8_report.describe_cache({}) == ""


def test_the_hit_rate_says_when_no_prompt_was_looked_up():
    assert_says(task_8_report._hit_rate(0.25, 128), "25.0", "(of 128 prompt tokens)",
                not_branch="no prompt looked up")
    assert_says(task_8_report._hit_rate(None, 0), branch="no prompt looked up",
                not_branch="prompt tokens)")


def test_kv_usage_missing_or_under_its_older_name():
    line = next(l for l in BUSY.splitlines() if l.startswith("vllm:kv_cache_usage_perc"))
    assert metrics.snapshot(BUSY.replace(line + "\n", ""), 0).kv_usage is None   # not measured
    older = BUSY.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert metrics.snapshot(older, 0).kv_usage == 0.2727272727272727
    # two engines: the usage is their mean, not their sum
    second = line.replace('engine="0"', 'engine="1"').replace("0.2727272727272727", "0.5")
    two = BUSY.replace(line, line + "\n" + second)
    assert metrics.snapshot(two, 0).kv_usage == (0.2727272727272727 + 0.5) / 2


def test_histogram_buckets_are_not_taken_for_sums():
    # _sum and _count are single samples; the buckets (one per `le`) stay out of the figures
    values = metrics.parse(AFTER)
    assert values["vllm:e2e_request_latency_seconds_count"] == 14.0
    assert metrics.snapshot(AFTER, 0).e2e_count == 14.0


# --- task 8's record: what --once saves, read back, and its row in the summary ----------------
def test_the_record_reads_back_typed_and_gives_the_summary_row():
    from lessons.task_8 import RECORD
    from lessons.task_8 import record as task8

    before, busy = metrics.snapshot(BEFORE, 0.0), metrics.snapshot(BUSY, 1.5)
    interval = task8.Interval.of(metrics.window(before, busy))
    assert (interval.num_prefix_query_tokens, interval.num_prefix_hit_tokens) == (128, 0)
    assert (interval.num_generation_tokens, interval.duration_s) == (265, 1.5)
    assert interval.prefix_hit_fraction == 0.0 and interval.mean_e2e_s is None
    snapshot = task8.Snapshot.of(busy, busy)
    assert (snapshot.num_generation_tokens, snapshot.num_running, snapshot.num_waiting,
            snapshot.num_finished, snapshot.num_prefix_query_tokens) == (365, 12, 0, 2, 142)
    assert snapshot.kv_usage_fraction == 0.2727272727272727
    load = task8.LoadSent(20, 19, 1, 50, 950, 260, 4.25, ["HTTP 500: boom"])
    record = task8.Dashboard("http://127.0.0.1:8000", "reused", {"block_size": "16"}, snapshot,
                             header=results.RunHeader("m", dtype="float32", threads=2),
                             engine="max_num_seqs=8", last_interval=interval, load=load)
    results.save("task_8_dashboard", record)
    back = results.load("task_8_dashboard", RECORD)
    assert (back.snapshot, back.last_interval, back.load) == (snapshot, interval, load)
    assert (back.base_url, back.server_state, back.engine, back.cache_config) == (
        "http://127.0.0.1:8000", "reused", "max_num_seqs=8", {"block_size": "16"})
    assert back.header.dtype == "float32" and isinstance(back.snapshot.num_running, int)
    # the summary's cell, as common/steps.py wrote it before the record moved here
    # the load's 20, the snapshot's 12 and 0, 265 tokens in 1.5 s, KV 27.3% to none
    assert_says(task8.summary_row(back), "20 sent", "12 running", "0 waiting", "176.7 tok/s",
                "KV 27%")
    bare = dataclasses.replace(back, load=None, last_interval=None,
                               snapshot=dataclasses.replace(snapshot, kv_usage_fraction=None))
    assert task8.summary_row(bare) == "12 running, 0 waiting"


# --- the Monitor against a real HTTP endpoint that serves the captured texts ----------------
class MetricsEndpoint:
    """A real HTTP server on loopback whose /metrics serves whatever text it is given."""

    def __init__(self, port: int):
        self.text = BEFORE
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = endpoint.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_monitor_follows_the_server_down_and_back():
    port = server.free_port()
    endpoint = MetricsEndpoint(port)
    watcher = monitor.Monitor(f"http://127.0.0.1:{port}", "m", latency_window_s=100)
    try:
        watcher.poll()
        assert watcher.latest().tokens_per_s is None and "Server UP" in watcher.status()
        endpoint.text = BUSY
        watcher.poll()
        p = watcher.latest()
        assert (p.running, p.kv_usage_pct) == (12, 100 * 0.2727272727272727)
        assert p.tokens_per_s > 0 and p.mean_ttft_s == (2.0723021030426025 - 0.1169729232788086) / 12
        endpoint.close()
        watcher.poll()
        assert_says(watcher.status(), f"http://127.0.0.1:{port}/metrics", "(ConnectionError)",
                    branch="Server DOWN", not_branch=("Server UP", "Connecting"))
        assert watcher.latest() == p                      # the history stays on the page
        endpoint = MetricsEndpoint(port)                   # back, restarted: counters from 0
        watcher.poll()
        assert "Server UP" in watcher.status() and "1 server restart" in watcher.status()
        assert watcher.latest().tokens_per_s is None       # nothing to compare with yet
        assert len(watcher.history()) == 3
    finally:
        endpoint.close()


def test_plot_frames_are_typed_and_hold_every_series():
    """What the page's plots get (see monitor.plot_frame): numbers as numbers even with
    no row yet, and every series in every frame, NaN where it has no value."""
    def point(t_s, ttft):
        return monitor.Point(t_s, None, 0, 0, None, ttft, None)

    columns = {"TTFT": "mean_ttft_s", "e2e": "mean_e2e_s"}
    empty = monitor.plot_frame([], columns)
    assert [str(t) for t in empty.dtypes] == ["float64", "float64", "str"]
    frame = monitor.plot_frame([point(0.5, None), point(1.5, 0.25)], columns)
    assert list(frame["series"]) == ["TTFT", "e2e", "TTFT", "e2e"]
    assert frame["value"].isna().tolist() == [True, True, False, True]
    assert frame["value"][2] == 0.25 and frame["t (s)"].tolist() == [0.5, 0.5, 1.5, 1.5]


# --- against a real vLLM server ---------------------------------------------------------------
@pytest.fixture(scope="module")
def slow_server(tiny_model):
    """One vLLM server on the tiny model for the tests below, with max_num_seqs=2: 2 requests
    run at a time, so a burst of 20 keeps it busy for seconds (a snapshot can catch it loaded,
    a kill can land mid-load). The last test kills it."""
    port = server.free_port()
    server.ensure_server(server.ServerConfig(tiny_model, "tiny", "float32", port=port,
                                             max_num_seqs=2))
    yield port
    server.stop_server(port)
    assert processes_on_port(port) == []


@pytest.mark.engine
def test_once_prints_and_saves_a_snapshot(slow_server):
    from common import load
    port = slow_server
    level = load.run_level(f"http://127.0.0.1:{port}", "tiny", load.user_prompts(3), 7)
    assert level.num_output_tokens == 21
    # every streamed chunk's arrival, in order (task 11's inter-token latency reads them): 7
    # tokens, one chunk a step, so 6 gaps; the TTFT is the first chunk with text
    for req in level.requests:
        assert len(req.token_times_s) == 7 and req.ttft_s in req.token_times_s
        assert req.token_times_s == sorted(req.token_times_s) and len(req.itl_s) == 6
        assert req.start_s > 0 and req.token_times_s[-1] <= req.latency_s
    proc = run_script("task_8_dashboard.py", "--once", "--server-port", str(port))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc.stdout)
    r = saved_result("task_8_dashboard")
    assert r["server_state"] == "reused" and r["dtype"] == "float32"
    assert r["snapshot"]["num_generation_tokens"] == 21 and r["snapshot"]["num_finished"] == 3
    assert r["snapshot"]["num_running"] == 0 and r["last_interval"]["tokens_per_s"] == 0
    assert r["cache_config"]["block_size"] == str(settings.BLOCK_SIZE)
    assert re.search(r"Generation tokens since start: +21\n", proc.stdout)
    out = " ".join(proc.stdout.split())
    assert "already running" in out and "left running on exit" in out
    # the insight says what the idle snapshot shows, not a claim about a batch it did not see
    assert_says(out, "(0 requests running)", branch="was idle at the snapshot",
                not_branch=("one batch", "caps the batch", "capped the batch"))
    # vLLM's prefix cache looked up every prompt token of the 3 requests and found none: their
    # prompts ("User 1: ...", "User 2: ...") part ways within the first block of 16 tokens
    prompt_tokens = sum(req.prompt_tokens for req in level.requests)
    assert (r["snapshot"]["num_prefix_query_tokens"], r["snapshot"]["num_prefix_hit_tokens"]) == \
        (prompt_tokens, 0)
    assert_says(out.partition("Prefix-cache hit rate since start (%):")[2], "0.0",
                f"(of {prompt_tokens} prompt tokens)")


@pytest.mark.engine
def test_once_under_load_sees_the_batch(slow_server):
    """--once --load 20 (what `make lab` runs): the snapshot is taken while the 20 requests run:
    2 run (max_num_seqs=2), the others wait, tokens flow, the KV cache holds the 2; the insight
    names max_num_seqs as the cap, because the snapshot shows it."""
    proc = run_script("task_8_dashboard.py", "--once", "--load", "20", "--max-tokens", "100",
                      "--interval", "0.5", "--server-port", str(slow_server))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc.stdout)
    r = saved_result("task_8_dashboard")
    assert r["snapshot"]["num_running"] == 2 and r["snapshot"]["num_waiting"] > 0
    assert r["last_interval"]["tokens_per_s"] > 0 and r["snapshot"]["kv_usage_fraction"] > 0
    assert r["load"]["num_prompt_tokens"] > 0
    assert r["load"] | {"duration_s": 0, "num_prompt_tokens": 0} == {
        "num_requests": 20, "num_succeeded": 20, "num_failed": 0, "max_tokens": 100,
        "num_output_tokens": 2_000, "num_prompt_tokens": 0, "duration_s": 0, "errors": []}
    out = " ".join(proc.stdout.split())
    assert_says(out, "max_num_seqs=2", "2 ran", f"{r['snapshot']['num_waiting']} waited",
                branch="capped the batch", not_branch=("the memory capped", "None waited"))
    assert "2 requests ran as one batch at" in out


@pytest.mark.engine
def test_once_under_load_counts_the_prompts_of_its_load(slow_server):
    """Issue 22, point 7: the snapshot's interval covers the load it reports. vLLM looks a
    prompt up in its prefix cache when it schedules the request, so an interval that began once
    the load was taken in saw none of it ('- (no prompt looked up)'). It begins before the first
    request is sent: 2 requests, both running at once (max_num_seqs=2), so every prompt token
    the server looked up during the run is in the interval's hit rate, and they are the load's."""
    url = f"http://127.0.0.1:{slow_server}"
    before = metrics.snapshot(metrics.fetch(url), 0)
    proc = run_script("task_8_dashboard.py", "--once", "--load", "2", "--max-tokens", "100",
                      "--interval", "0.5", "--server-port", str(slow_server))
    after = metrics.snapshot(metrics.fetch(url), 0)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc.stdout)
    queried, hits = (after.prefix_queries - before.prefix_queries,
                     after.prefix_hits - before.prefix_hits)
    assert queried > 0
    out = " ".join(proc.stdout.split())
    assert_says(out.partition("Prefix-cache hit rate (%):")[2], f"{100 * hits / queried:.1f}",
                f"(of {queried:,.0f} prompt tokens)", not_branch="no prompt looked up")
    r = saved_result("task_8_dashboard")
    interval = r["last_interval"]
    assert (interval["num_prefix_query_tokens"], interval["num_prefix_hit_tokens"]) == \
        (queried, hits)
    assert interval["prefix_hit_fraction"] == hits / queried
    assert r["load"]["num_prompt_tokens"] == queried      # the load's own 2 prompts, no other
    assert r["load"]["num_requests"] == r["load"]["num_succeeded"] == 2


@pytest.mark.engine
def test_task6_when_the_server_dies_mid_load(slow_server):
    """The server killed (SIGKILL, as a crash) while task 6's 8 users run: the report still
    prints with the failures counted, then one line and exit 1; no traceback, nothing left."""
    port = slow_server
    pid = server.lab_server_pid(port)
    proc = subprocess.Popen([sys.executable, "task_6_multi_user_load.py", "--base-url",
                             f"http://127.0.0.1:{port}", "--users", "1,8", "--max-tokens", "100"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pipes = PipeReader(proc)
    deadline = time.monotonic() + 120
    while True:   # the 8 users' level runs: 2 at a time (max_num_seqs=2), the others wait
        snap = metrics.snapshot(metrics.fetch(f"http://127.0.0.1:{port}"), 0)
        if snap.running == 2 and snap.waiting:
            break
        assert proc.poll() is None and time.monotonic() < deadline, "".join(pipes.out)[-3000:]
        time.sleep(0.1)
    os.killpg(os.getpgid(pid), signal.SIGKILL)          # the server and its engine core
    code, text, err = pipes.wait(timeout=300)
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ERROR: ") and \
        err.strip().splitlines()[-1].endswith(" request(s) failed (see the report above)")
    r = saved_result("task_6_multi_user_load")
    first, second = r["levels"]                           # common.load.LoadLevel, saved
    assert first["num_ok"] == first["num_users"] == 1     # none failed
    assert second["num_users"] == 8 and second["num_ok"] < 8
    assert (r["sequential"]["num_users"], r["sequential"]["num_ok"]) == (8, 0)   # sent after
                                                          # the crash: all 8 refused
    assert "FAILED" in text and re.search(r"\n +8 +\d+ .* \d/8\n", text)
    deadline = time.monotonic() + 10     # a killed process of 1-2 GB takes a moment to be gone
    while processes_on_port(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_on_port(port) == []


@pytest.mark.parametrize("args, message", [
    (["--interval", "0"], "--interval must be between 0.2 and 10 seconds"),
    (["--load", "5"], "--load goes with --once"),
    (["--once", "--base-url", "http://127.0.0.1:9"], "no OpenAI-compatible server answers"),
    (["--port", "70000"], "'70000' is not a port (1-65535)"),
    (["--server-port", "0"], "'0' must be greater than 0"),
])
def test_bad_dashboard_input_is_one_line(args, message):
    proc = run_script("task_8_dashboard.py", *args)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_busy_dashboard_port_is_refused():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        proc = run_script("task_8_dashboard.py", "--port", str(busy))
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"ERROR: port {busy} is in use (another dashboard?); stop it or choose another --port")


# --- the page in a real browser ---------------------------------------------------------------
def wait_for(driver, elem_id: str, pattern: str, timeout_s: float = 60) -> re.Match:
    """Wait until the element's text matches; fail with what the page showed last."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By

    deadline, text = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            text = driver.find_element(By.ID, elem_id).text
        except WebDriverException:
            pass
        match = re.search(pattern, text)
        if match:
            return match
        time.sleep(0.25)
    raise AssertionError(f"#{elem_id} never matched {pattern!r}; it showed: {text!r}")


# Vega (Gradio's plots) writes what it draws into the SVG's ARIA labels: each axis says its scale
# and range ("X-axis titled 't' for a linear scale with values from 0 to 16"), each line mark
# its first datum ("t: 8.5; s: 0.16; series: TTFT") beside its stroke and path.
PLOTS_JS = """
return Array.from(document.querySelectorAll('svg')).map(svg => {
  const labels = role => Array.from(svg.querySelectorAll(`[aria-roledescription="${role}"]`))
    .map(e => e.getAttribute('aria-label') || '');
  return {title: labels('title')[0] || '', axes: labels('axis'),
          lines: Array.from(svg.querySelectorAll('[aria-roledescription="line mark"]')).map(
            e => ({label: e.getAttribute('aria-label') || '', stroke: e.getAttribute('stroke'),
                   d: e.getAttribute('d') || ''}))};
}).filter(plot => plot.title);
"""
PLOT_SERIES = {"Generation throughput": ["tokens/s"], "Requests": ["running", "waiting"],
               "KV-cache usage": ["KV-cache %"], "Mean latency, last 10 s": ["TTFT", "e2e"]}


def check_plots(driver) -> dict[str, tuple[float, float]]:
    """Every plot of the page as a person would read it: both axes numeric (a linear scale with
    a range, not a list of raw floats taken as text), and a coloured, drawn line per series.
    Returns each plot's y range."""
    plots = {p["title"].removeprefix("Title text '").removesuffix("'"): p
             for p in driver.execute_script(PLOTS_JS)}
    assert set(plots) == set(PLOT_SERIES), list(plots)
    y_ranges = {}
    for title, series in PLOT_SERIES.items():
        plot = plots[title]
        ranges = [re.search(r"for a linear scale with values from (-?[\d.]+) to (-?[\d.]+)$", a)
                  for a in plot["axes"]]
        assert len(ranges) == 2 and all(ranges), f"{title}: axes {plot['axes']}"
        y_ranges[title] = (float(ranges[1].group(1)), float(ranges[1].group(2)))
        assert sorted(re.search(r"series: (.*)$", line["label"]).group(1)
                      for line in plot["lines"]) == sorted(series), f"{title}: {plot['lines']}"
        for line in plot["lines"]:   # a line with no colour, or no segment, shows nothing
            assert line["stroke"] not in (None, "", "none") and "L" in line["d"], \
                f"{title}: {line}"
    return y_ranges


def drawn_plots(driver, timeout_s: float = 60) -> dict[str, tuple[float, float]]:
    """check_plots once every line has its second point: a slow machine draws a frame later
    than a fast one, so wait for the lines, not for a time. Past timeout_s, its failure."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return check_plots(driver)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_dashboard_plots_in_a_real_browser(tmp_path):
    """The page against captured /metrics texts (no vLLM): idle at first, so the latency plot's
    first frames have no value; then 12 requests running; then finished. Every plot must still
    read as numbers with a visible line per series, and the latency plot's y range hold the
    mean latency the table shows. (Gradio keeps a plot's axes from its first frame: an untyped
    empty one gave the latency plot text axes and no line.)"""
    port, dashboard_port = server.free_port(), server.free_port()
    endpoint = MetricsEndpoint(port)
    watcher = monitor.Monitor(f"http://127.0.0.1:{port}", "m", interval_s=0.5).start()
    demo = monitor.build_ui(watcher, 10, refresh_s=0.5, engine="")
    driver = profile = None
    try:
        demo.launch(server_name="127.0.0.1", server_port=dashboard_port,
                    prevent_thread_lock=True, quiet=True)
        driver, profile = chromium()
        driver.get(f"http://127.0.0.1:{dashboard_port}/")
        wait_for(driver, "status", r"Server UP")
        time.sleep(2)                                  # idle frames: no latency yet
        endpoint.text = BUSY
        wait_for(driver, "figures", r"Requests running\s+12")
        endpoint.text = AFTER
        e2e = wait_for(driver, "figures", r"Mean e2e latency, last 10 s \(s\)\s+(\d+\.\d{3})")
        low, high = drawn_plots(driver)["Mean latency, last 10 s"]
        assert low <= float(e2e.group(1)) <= high
        assert driver.save_screenshot(str(tmp_path / "dashboard_plots.png"))
    finally:
        if driver:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)
        demo.close()
        watcher.stop()
        endpoint.close()


@pytest.mark.engine
def test_dashboard_in_a_real_browser(tiny_model, tmp_path):
    from selenium.webdriver.common.by import By

    port, dashboard_port = server.free_port(), server.free_port()
    proc = subprocess.Popen([sys.executable, "task_8_dashboard.py", "--model", tiny_model,
                             "--dtype", "float32", "--server-port", str(port), "--port",
                             str(dashboard_port), "--max-tokens", "100"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()
    driver, profile = None, None
    try:
        deadline = time.monotonic() + 240
        while not any("Serving the dashboard" in line for line in out):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(out)[-3000:]
            time.sleep(0.5)
        assert server.running_config(port) is not None        # it started the lab server
        driver, profile = chromium()
        driver.get(f"http://127.0.0.1:{dashboard_port}/")
        wait_for(driver, "status", r"Server UP: http://127\.0\.0\.1:\d+")
        wait_for(driver, "figures", r"Requests running\s+0")

        # the button is drawn after the status and figures in some runs: wait for it, not a time
        from selenium.webdriver.support import expected_conditions
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(driver, 60).until(expected_conditions.element_to_be_clickable(
            (By.ID, "send-load"))).click()                        # 20 requests (the default)
        wait_for(driver, "load-status", r"Sending 20 concurrent requests|Last load")
        rate = wait_for(driver, "figures", r"Generation tokens/s \(last interval\)\s+([1-9][\d.]*)")
        assert float(rate.group(1)) > 0
        wait_for(driver, "load-status", r"Last load: 20/20 requests ok in [\d.]+ s, 2,000 tokens")
        e2e = wait_for(driver, "figures", r"Mean e2e latency, last 10 s \(s\)\s+(\d+\.\d{3})")
        low, high = drawn_plots(driver)["Mean latency, last 10 s"]
        assert low <= float(e2e.group(1)) <= high
        # in the test's own folder (pytest keeps the last 3 runs' under /tmp/pytest-of-$USER),
        # never in the learner's results/
        shot = tmp_path / "task_8_dashboard_browser_test.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000

        # (the server going down and coming back, the status line saying so, is
        # test_monitor_follows_the_server_down_and_back's: a second vLLM start here would add
        # ~30 s for the same code; here the dashboard stops the server it started)
    finally:
        if driver:
            driver.quit()
            shutil.rmtree(profile, ignore_errors=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, "".join(out)[-3000:]
    assert_says("".join(out), f":{port}", branch="Stopped the vLLM server",
                not_branch="had already stopped")
    assert processes_on_port(port) == [] and processes_on_port(dashboard_port) == []


@pytest.mark.lab_steps("task_7_tuning", "task_8_dashboard")
def test_task_8_on_the_real_model_sees_the_batch_capped_by_task_7(lab_run):
    # task 8 watches the server task 7 left (config C, max_num_seqs=8) while 20 requests run:
    # 8 run, the rest wait, the KV cache is in use, tokens flow; the insight names the cap
    assert lab_run.args("task_8_dashboard") == ["--once", "--load", "20", "--max-tokens", "20",
                                                "--server-port", str(lab_run.port)]
    t7 = lab_run.saved("task_7_tuning")
    t8 = lab_run.saved("task_8_dashboard")
    assert t8["server_state"] == "reused" and "max_num_seqs=8" in t8["engine"]
    assert t8["load"]["num_prompt_tokens"] > 0
    assert t8["load"] | {"duration_s": 0, "num_prompt_tokens": 0} == {
        "num_requests": 20, "num_succeeded": 20, "num_failed": 0, "max_tokens": 20,
        "num_output_tokens": 400, "duration_s": 0, "num_prompt_tokens": 0, "errors": []}
    assert t8["snapshot"]["num_running"] == 8 and t8["snapshot"]["num_waiting"] > 0
    assert t8["last_interval"]["tokens_per_s"] > 0
    assert t8["snapshot"]["kv_usage_fraction"] > 0
    assert "max_num_seqs=8 capped the batch: 8 ran" in lab_run.out
    assert float(t8["cache_config"]["kv_cache_max_concurrency"]) == \
        t7["configs"][2]["kv_max_concurrency"]
    assert lab_run.row("task_8_dashboard").startswith("20 sent: 8 running, ")   # the summary's
