"""Task 7's report (task_7_tuning.py prints it, in this order): each config's server, KV cache
and load, then the three side by side, then the KEY INSIGHT. Printing only: the script
measures, these print what it measured (the record's ConfigRun)."""
from __future__ import annotations

from common import fmt, kv, report
from lessons.task_7.record import ConfigRun, is_compared


def print_server(srv, config) -> None:
    """The config's two knobs and the server's state; its whole command line behind --detail."""
    state = f"{srv.state}, ready after {srv.startup_s:.1f} s" if srv.startup_s else srv.state
    report.row("Server", state)
    report.row("  max_model_len, max_num_seqs", f"{config.max_model_len}, {config.max_num_seqs}")
    with report.detail():
        report.row("  settings", srv.config.describe())


def print_run(run: ConfigRun, num_requests: int) -> None:
    # blocks x block size, as task 8 shows it: the engine's own kv_cache_size_tokens label is its
    # max concurrency x max_model_len, which halves at max_model_len 64 for the same blocks
    if run.num_kv_blocks and run.kv_block_size_tokens:
        report.row("KV cache (engine)", f"{run.num_kv_blocks} blocks x {run.kv_block_size_tokens} "
                                        f"= {run.num_kv_blocks * run.kv_block_size_tokens:,} "
                                        f"tokens")
    report.row("  max concurrency", f"{run.kv_max_concurrency:.2f}x requests of "
                                    f"{run.config.max_model_len} tokens")
    level = run.level
    throughput = (f"{_tok_s(run)} tok/s" if run.spread and run.spread.num_passes > 1
                  else f"{level.tokens_per_s:.1f} tok/s")
    report.row("Result", throughput)
    report.row("  mean latency, requests ok", f"{fmt.secs(level.mean_latency_s)} s, "
                                              f"{level.num_ok}/{num_requests}")
    for error in level.errors:
        report.note(f"failed: {error}", indent=2)
    report.row("Requests at once (peak)", f"{run.peak_num_requests_running} running, "
                                          f"{run.peak_num_requests_waiting} waiting")
    with report.detail():
        report.note(f"(the most seen in {run.num_metrics_samples} reads of /metrics during the "
                    f"passes)", indent=2)
        if run.warmup_s is not None:
            report.row("Warm-up request", f"{fmt.secs(run.warmup_s)} s (not counted)")


def print_comparison(runs: list[ConfigRun], num_requests: int, port: int) -> None:
    report.section("CONFIGURATION COMPARISON")
    report.table(["Cfg", "len", "seqs", "blocks", "conc.", "run/wait", "tok/s", "Lat(s)", "OK"],
                 [(r.label[0], r.config.max_model_len, r.config.max_num_seqs,
                   r.num_kv_blocks if r.num_kv_blocks is not None else "-",
                   f"{int(r.kv_max_concurrency)}x",
                   f"{r.peak_num_requests_running}/{r.peak_num_requests_waiting}",
                   f"{r.level.tokens_per_s:.1f}", fmt.secs(r.level.mean_latency_s),
                   f"{r.level.num_ok}/{num_requests}") for r in runs],
                 widths=[4, 5, 6, 7, 7, 9, 8, 8, 7])
    report.note(f"len = max_model_len, seqs = max_num_seqs, blocks = KV blocks of "
                f"{runs[0].kv_block_size_tokens} tokens, conc. = max concurrency at len, "
                f"run/wait = peak requests running/waiting, Lat = mean latency")
    if all(r.spread and r.spread.num_passes > 1 for r in runs):
        report.note(f"tok/s: each config's median pass of {runs[0].spread.num_passes} (lowest-"
                    f"highest above); Lat and OK: that pass's.")
    report.note(f"Server left running with config {runs[-1].label} on :{port}; "
                f"`make stop` stops it (task 5 restarts the default).")


def _tok_s(run: ConfigRun) -> str:
    """'229.9 (229.7-240.9)': the median pass, the lowest and highest beside it."""
    s = run.spread
    return f"{s.median:.1f} ({s.low:.1f}-{s.high:.1f})"


def versus(x: ConfigRun, y: ConfigRun) -> str:
    """How y's tokens/s stands against x's (two ways): apart only when their spreads do not
    overlap."""
    nx, ny = x.label[0], y.label[0]
    if not is_compared(x, y):
        return (f"{ny} made {y.level.tokens_per_s:.1f} tok/s against {nx}'s "
                f"{x.level.tokens_per_s:.1f}, one pass each: no spread to tell them apart by.")
    if x.spread.overlaps(y.spread):
        return (f"{ny} made {_tok_s(y)} tok/s against {nx}'s {_tok_s(x)}: the spreads "
                f"overlap, so {nx} and {ny} cannot be told apart.")
    if y.spread.median > x.spread.median:
        return (f"{ny} made {_tok_s(y)} tok/s against {nx}'s {_tok_s(x)}: {ny} FASTER than "
                f"{nx}, the spreads apart.")
    return (f"{ny} made {_tok_s(y)} tok/s against {nx}'s {_tok_s(x)}: {ny} SLOWER than {nx}, "
            f"the spreads apart.")


def insights(rows: list[ConfigRun], num_requests: int) -> list[str]:
    """The KEY INSIGHT lines, each from what configs A, B and C measured; two configs' tokens/s
    are called apart only when their spreads of passes do not overlap."""
    a, b, c = rows
    len_a, len_b = a.config.max_model_len, b.config.max_model_len
    conc_a, conc_b = int(a.kv_max_concurrency), int(b.kv_max_concurrency)
    # a paged cache: vLLM hands a request KV blocks as its tokens arrive, so max_model_len
    # reserves nothing; it caps a request's length, and with it the engine's admission figure,
    # the max concurrency (requests of max_model_len the cache could hold at once)
    if b.kv_max_concurrency > a.kv_max_concurrency:
        context = (f"max_model_len caps a request's length; it reserves no KV memory (vLLM "
                   f"adds blocks as tokens arrive). {len_a} -> {len_b} moved only the max "
                   f"concurrency, {conc_a}x -> {conc_b}x.")
    else:   # blocks of max_model_len or more (settings.BLOCK_SIZE; vLLM's CPU default is 128)
        block = b.kv_block_size_tokens
        context = (f"max_model_len caps a request's length; it reserves no KV memory (vLLM "
                   f"adds blocks as tokens arrive). In {block}-token blocks, {len_b} and "
                   f"{len_a} tokens need {kv.cdiv(len_b, block)} and {kv.cdiv(len_a, block)}: "
                   f"max concurrency {conc_b}x for B, {conc_a}x for A.")
    shorter = f"Shorter context: {versus(a, b)}"
    seqs = c.config.max_num_seqs
    if c.peak_num_requests_waiting:
        batch = (f"max_num_seqs={seqs} caps the batch: {c.peak_num_requests_running} ran and "
                 f"{c.peak_num_requests_waiting} waited. {versus(b, c)}")
    elif not c.peak_num_requests_running:   # no read of /metrics landed while requests ran
        batch = (f"max_num_seqs={seqs}: none of {c.num_metrics_samples} read(s) of /metrics "
                 f"caught C's requests running, so its cap was not observed. {versus(b, c)}")
    else:
        batch = (f"max_num_seqs={seqs} capped nothing here: at most "
                 f"{c.peak_num_requests_running} of the {num_requests} requests ran at once, "
                 f"none waiting. {versus(b, c)}")
    if c.num_kv_blocks is None:   # an engine that does not export its block count
        return [context, shorter, batch]
    if c.num_kv_blocks == b.num_kv_blocks:
        memory = (f"max_num_seqs reserves no memory either: C's KV cache is the same "
                  f"{c.num_kv_blocks} blocks as B's.")
    else:
        memory = (f"max_num_seqs caps only the batch, yet C's KV cache is {c.num_kv_blocks} "
                  f"blocks against B's {b.num_kv_blocks}: this run cannot say it reserves none.")
    return [context, shorter, batch, memory]
