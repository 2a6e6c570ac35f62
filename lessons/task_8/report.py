"""Task 8's report (task_8_dashboard.py prints it, in this order): the boxed header with what
is watched and the first read of /metrics; with --once the interval it read, the load it sent
and the KEY INSIGHT; for the live page, where the page is. Printing only: the script measures,
these print what it measured (its record's Snapshot, Interval and LoadSent, read by
attribute)."""
from __future__ import annotations

import socket

from common import fmt, metrics, report, settings
from lessons.task_8.monitor import LATENCY_WINDOW_S

PRODUCTION = ("Production watches these same /metrics: Prometheus scrapes them, Grafana plots "
              "them.")
KV_FULL = 0.9   # KV-cache usage from which the cache, not max_num_seqs, is taken as the cap


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
    report.row("Mean TTFT since start (s)", fmt.secs(snap.mean_ttft_s, 3))
    report.row("Mean e2e latency since start (s)", fmt.secs(snap.mean_e2e_s, 3))
    report.row("Preemptions since start", f"{snap.preemptions:,.0f}")
    report.row("Prefix-cache hit rate since start (%)", _hit_rate(snap.prefix_hit_rate,
                                                                  snap.prefix_queries))
    report.note(f"{report.term('TTFT')}; e2e: end to end, from the request's arrival to its "
                f"last token.")


def print_interval(interval, snap, num_requests: int | None) -> None:
    """--once: what the server did in the interval (task 8's Interval; None: it restarted), the
    batch at its fullest (its Snapshot); num_requests: --load's N."""
    title = f"{num_requests} REQUESTS SENT, " if num_requests else ""
    report.section(f"{title}LAST {interval.duration_s:.1f} s" if interval else
                   f"{title}LAST INTERVAL")
    if interval is None:
        report.note("The server restarted between the two reads; run again.")
        return
    report.row("Generation tokens/s", f"{interval.tokens_per_s:.1f}")
    report.row("Requests running / waiting", f"{snap.num_running} / {snap.num_waiting}")
    report.row("KV-cache usage (%)", _percent(snap.kv_usage_fraction))
    report.row("Prefix-cache hit rate (%)", _hit_rate(interval.prefix_hit_fraction,
                                                      interval.num_prefix_query_tokens))


def print_load(sent) -> None:
    """--once --load: the load (task 8's LoadSent), once it finished."""
    report.row("The load, when it finished", f"{sent.num_succeeded}/{sent.num_requests} requests "
                                             f"ok in {sent.duration_s:.1f} s, "
                                             f"{sent.num_output_tokens:,} tokens")
    for error in sent.errors:
        report.note(f"failed: {error}", indent=2)


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


def print_dashboard(args) -> str:
    """The live page's section and header insight; returns the page's URL."""
    host = "127.0.0.1" if args.dashboard_host == "0.0.0.0" else args.dashboard_host
    url = f"http://{host}:{args.dashboard_port}"
    report.section("DASHBOARD")
    report.row("Dashboard URL", url)
    if args.dashboard_host == "0.0.0.0":
        report.row("  from another machine", f"http://{socket.gethostname()}:"
                                             f"{args.dashboard_port} (or this machine's address)")
    report.row("Refresh", f"every {args.interval:g} s; latency means over the last "
                          f"{LATENCY_WINDOW_S:g} s")
    report.row("Load button", f"N concurrent requests of {args.max_tokens} tokens each")
    # nothing is measured yet: what to look for, not a finding
    report.insight([PRODUCTION, "Send requests from the page and watch running, waiting and "
                                "KV-cache usage: whichever limit is reached first (max_num_seqs, "
                                "or the KV cache at 100%) makes the rest wait."])
    return url


def engine_line(srv, cache_labels: dict) -> str:
    """The engine's settings and KV capacity, for the page."""
    parts = [f"Engine: {srv.config.describe()}."] if srv.config else []
    if describe_cache(cache_labels):
        parts.append(f"KV cache: {describe_cache(cache_labels)}.")
    return " ".join(parts)


def insight_lines(snap, tokens_per_s: float | None, max_num_seqs: int | None) -> list[str]:
    """The KEY INSIGHT of a snapshot (task 8's Snapshot), chosen from what it shows: the batch,
    what waited, and which limit (max_num_seqs or the KV cache) held the others back."""
    running, waiting, usage = snap.num_running, snap.num_waiting, snap.kv_usage_fraction
    if not running:
        return [PRODUCTION, "The server was idle at the snapshot (0 requests running): nothing "
                            "to batch; --once --load N takes it while N requests run."]
    kv = None if usage is None else fmt.pct(usage, 1)
    if tokens_per_s is None:
        lines = [PRODUCTION, f"{running} requests ran as one batch: each engine step made a "
                             f"token for every one of them."]
    else:
        lines = [PRODUCTION, f"{running} requests ran as one batch at {tokens_per_s:.1f} tok/s: "
                             f"each engine step made a token for every one of them."]
    if not waiting and kv:
        lines.append(f"None waited: all {running} fit, in {kv} of the KV cache.")
    elif not waiting:
        lines.append(f"None waited: all {running} fit.")
    elif max_num_seqs and running >= max_num_seqs and kv:
        lines.append(f"max_num_seqs={max_num_seqs} capped the batch: {running} ran, {waiting} "
                     f"waited, with the KV cache {kv} full: not the memory.")
    elif max_num_seqs and running >= max_num_seqs:
        lines.append(f"max_num_seqs={max_num_seqs} capped the batch: {running} ran, {waiting} "
                     f"waited.")
    elif kv and usage >= KV_FULL:
        lines.append(f"The KV cache was {kv} full: the memory capped the batch, {waiting} "
                     f"waited.")
    elif kv:
        lines.append(f"{waiting} waited, with {running} running and the KV cache {kv} full.")
    else:
        lines.append(f"{waiting} waited, with {running} running.")
    return lines
