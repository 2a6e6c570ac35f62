"""Task 7: Tuning vLLM Parameters for Production.

Benchmarks three server configurations with the same load, 10 concurrent requests of 50 tokens,
restarting the lab's server for each (the restart time is shown). On each server one warm-up
request goes first, timed apart and not counted; then the load runs in --passes passes (3 by
default), and the config's figures are those of its median pass by tokens/s, the spread of its
passes (lowest-highest) beside them. The configs cannot take turns pass by pass (each needs a
restart), so two configs are called apart only when their spreads do not overlap:

    A: Default              max_model_len=128, max_num_seqs=256
    B: Shorter Context      max_model_len=64,  max_num_seqs=256
    C: Limited Concurrency  max_model_len=64,  max_num_seqs=8

Beside throughput and latency, each row shows what the engine reports on /metrics: its KV
cache (blocks x block size, max concurrency at max_model_len) and the most requests that ran at
once and waited, sampled during the passes. Every KEY INSIGHT line is chosen from those figures. Any
failed request is counted in the report and makes the exit code 1; a --max-tokens that cannot
fit a config's max_model_len is refused before any server starts. The server is left running
with the last config. Beside it in lessons/task_7/: the record and the summary's row (record.py),
the figure (figure.py).

    python task_7_tuning.py [--requests 10] [--max-tokens 50] [--passes 3] [--model M]
        [--port 8000]
"""
from __future__ import annotations

from common import cli, figures, kv, load, measure, metrics, report, results, settings
from lessons.task_7 import FIGURES
from lessons.task_7.record import ConfigRun, Tuning, TuningConfig, is_compared

SCRIPT = "task_7_tuning"

CONFIGS = [TuningConfig("A: Default", 128, 256),
           TuningConfig("B: Shorter Context", 64, 256),
           TuningConfig("C: Limited Concurrency", 64, 8)]


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    group = parser.add_argument_group("server")
    group.add_argument("--base-url", default=None,
                       help="not supported: task 7 restarts the server for each config, which it "
                            "only does for the server the lab manages")
    group.add_argument("--host", default="127.0.0.1", help="address the lab's server listens on")
    group.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                       help=f"port of the lab's server (default {settings.SERVER_PORT})")
    group = parser.add_argument_group("load")
    group.add_argument("--requests", type=cli.positive_int, default=10,
                       help="concurrent requests per config (default 10)")
    group.add_argument("--max-tokens", type=cli.positive_int, default=settings.MAX_NEW_TOKENS,
                       help=f"new tokens per request (default {settings.MAX_NEW_TOKENS})")
    group.add_argument("--passes", type=cli.positive_int, default=measure.PASSES,
                       help=f"passes of the load on each config (default {measure.PASSES})")
    args = parser.parse_args(argv)
    if args.base_url:
        parser.error("--base-url: task 7 restarts the server for each config, so it needs the "
                     "server the lab manages (use --port, and --host for its address)")
    return args


def check_fits(args, model) -> None:
    """--max-tokens must fit every config's max_model_len beside the load's longest prompt, else
    the server refuses every request of that config: refused up front, one line, exit 2."""
    longest = cli.longest_prompt_tokens(model.path, load.user_prompts(args.requests))
    for config in CONFIGS:
        if longest + args.max_tokens > config.max_model_len:
            cli.fail(f"--max-tokens {args.max_tokens} does not fit config {config.label} "
                     f"(max_model_len {config.max_model_len}): the load's longest prompt is "
                     f"{longest} tokens, and {longest} + {args.max_tokens} > "
                     f"{config.max_model_len}")


def _int_label(labels: dict, name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() else None


# --- the measurement: one config's server, its KV cache, the load ------------------------------
def benchmark(args, config: TuningConfig) -> ConfigRun:
    report.section(f"CONFIG {config.label}")
    srv, _, _ = cli.lab_server(None, args.model, args.dtype, host=args.host, port=args.port,
                               max_num_seqs=config.max_num_seqs,
                               max_model_len=config.max_model_len)
    restart = f"{srv.state}, ready after {srv.startup_s:.1f} s" if srv.startup_s else srv.state
    report.row("Server", f"{srv.config.describe()}")
    report.row("  state", restart)
    cache = metrics.info_labels(metrics.fetch(srv.base_url), "vllm:cache_config")
    num_blocks, block_size = _int_label(cache, "num_gpu_blocks"), _int_label(cache, "block_size")
    max_concurrency = float(cache["kv_cache_max_concurrency"])
    # a fresh server's first request runs slower: timed apart, never set beside the passes
    warmup = load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)
    if warmup.num_failed:
        cli.fail(f"config {config.label}: the warm-up request failed: {warmup.errors[0]}",
                 code=1)
    with metrics.Sampler(srv.base_url) as sampler:
        passes = run_passes(srv, args.requests, args.max_tokens, args.passes)
    tokens_per_s = [p.tokens_per_s for p in passes]
    run = ConfigRun(config, srv.state, max_concurrency,
                    passes[measure.median_index(tokens_per_s)], srv.startup_s, num_blocks,
                    block_size, peak_num_requests_running=sampler.max_running,
                    peak_num_requests_waiting=sampler.max_waiting,
                    num_metrics_samples=sampler.num_samples,
                    spread=measure.Spread.of(tokens_per_s), warmup_s=warmup.duration_s)
    print_run(run, args.requests)
    return run


def run_passes(srv, num_requests: int, max_tokens: int, num_passes: int
               ) -> list[load.LoadLevel]:
    """The load, pass after pass on the same server; a pass in which a request failed is the
    last (the server is down or refusing: a pass more measures nothing)."""
    found = []
    for p in range(num_passes):
        print(f"  Pass {p + 1}/{num_passes}...", end=" ", flush=True)
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(num_requests),
                               max_tokens)
        found.append(level)
        print(f"{level.tokens_per_s:.1f} tok/s, {load.seconds(level.mean_latency_s)} s avg, "
              f"{level.num_ok}/{num_requests} ok", flush=True)
        if level.num_failed:
            break
    return found


# --- the report: each config, the comparison, the insight ---------------------------------------
def print_run(run: ConfigRun, num_requests: int) -> None:
    # blocks x block size, as task 8 shows it: the engine's own kv_cache_size_tokens label is its
    # max concurrency x max_model_len, which halves at max_model_len 64 for the same blocks
    if run.num_kv_blocks and run.kv_block_size_tokens:
        report.row("KV cache (engine)", f"{run.num_kv_blocks} blocks x {run.kv_block_size_tokens} "
                                        f"tokens = "
                                        f"{run.num_kv_blocks * run.kv_block_size_tokens:,} tokens")
    report.row("  max concurrency", f"{run.kv_max_concurrency:.2f}x requests of "
                                    f"{run.config.max_model_len} tokens")
    if run.warmup_s is not None:
        report.row("Warm-up request", f"{run.warmup_s:.2f} s (not counted)")
    level = run.level
    throughput = (run.spread.text(unit=" tok/s") if run.spread and run.spread.num_passes > 1
                  else f"{level.tokens_per_s:.1f} tok/s")
    report.row("Result", f"{throughput}, {load.seconds(level.mean_latency_s)} s avg latency, "
                         f"{level.num_ok}/{num_requests} ok")
    if run.spread and run.spread.num_passes > 1:
        report.note("(tokens/s: the median pass, lowest-highest beside it; the latency and the "
                    "requests ok are that pass's)", indent=2)
    for error in level.errors:
        report.note(f"failed: {error}", indent=2)
    report.row("Requests at once (peak)", f"{run.peak_num_requests_running} running, "
                                          f"{run.peak_num_requests_waiting} waiting")
    report.note(f"(the most seen in {run.num_metrics_samples} reads of /metrics during the "
                f"passes)", indent=2)


def print_comparison(runs: list[ConfigRun], num_requests: int, port: int) -> None:
    report.section("CONFIGURATION COMPARISON")
    report.table(["Cfg", "len", "seqs", "blocks", "conc.", "run/wait", "tok/s", "Lat(s)", "OK"],
                 [(r.label[0], r.config.max_model_len, r.config.max_num_seqs,
                   r.num_kv_blocks if r.num_kv_blocks is not None else "-",
                   f"{int(r.kv_max_concurrency)}x",
                   f"{r.peak_num_requests_running}/{r.peak_num_requests_waiting}",
                   f"{r.level.tokens_per_s:.1f}", load.seconds(r.level.mean_latency_s),
                   f"{r.level.num_ok}/{num_requests}") for r in runs],
                 widths=[4, 5, 6, 7, 7, 9, 8, 8, 7])
    report.note(f"len = max_model_len, seqs = max_num_seqs, blocks = KV blocks of "
                f"{runs[0].kv_block_size_tokens} tokens, conc. = max concurrency at len, "
                f"run/wait = peak requests running/waiting, Lat = mean latency")
    if all(r.spread and r.spread.num_passes > 1 for r in runs):
        report.note(f"tok/s and Lat: each config's median pass of {runs[0].spread.num_passes}; "
                    f"tok/s of every pass (lowest-highest): " + ", ".join(
                        f"{r.label[0]} {r.spread.low:.1f}-{r.spread.high:.1f}" for r in runs))
    report.note(f"Server left running with config {CONFIGS[-1].label} on :{port}; "
                f"`make stop` stops it (task 5 restarts the default).")


def versus(x: ConfigRun, y: ConfigRun) -> str:
    """How y's tokens/s stands against x's: apart only when their spreads do not overlap."""
    nx, ny = x.label[0], y.label[0]
    if not is_compared(x, y):
        return (f"{ny} made {y.level.tokens_per_s:.1f} tok/s against {nx}'s "
                f"{x.level.tokens_per_s:.1f}, one pass each: no spread to tell them apart by")
    said = f"{ny} made {y.spread.text(unit=' tok/s')} against {nx}'s {x.spread.text()}"
    if x.spread.overlaps(y.spread):
        return f"{said}: the spreads overlap, so {nx} and {ny} cannot be told apart on this machine"
    return (f"{said}: {ny} {'FASTER' if y.spread.median > x.spread.median else 'SLOWER'} than "
            f"{nx}, the spreads apart")


def insights(rows: list[ConfigRun], num_requests: int) -> list[str]:
    """The KEY INSIGHT lines, each from what configs A, B and C measured; two configs' tokens/s
    are called apart only when their spreads of passes do not overlap."""
    a, b, c = rows
    len_a, len_b = a.config.max_model_len, b.config.max_model_len
    if b.kv_max_concurrency > a.kv_max_concurrency:
        context = (f"max_model_len sets the KV memory per request: {len_a} -> "
                   f"{len_b} tokens took the engine from "
                   f"{int(a.kv_max_concurrency)}x to {int(b.kv_max_concurrency)}x requests "
                   f"at once")
    else:   # blocks of max_model_len or more (settings.BLOCK_SIZE; vLLM's CPU default is 128)
        block = b.kv_block_size_tokens
        context = (f"max_model_len sets the KV memory per request in whole {block}-token blocks: "
                   f"{len_b} tokens hold {kv.cdiv(len_b, block)} "
                   f"block(s), {len_a} tokens {kv.cdiv(len_a, block)}, "
                   f"so B fits {int(b.kv_max_concurrency)}x requests at once, A "
                   f"{int(a.kv_max_concurrency)}x")
    shorter = f"Shorter context: {versus(a, b)}"
    if c.peak_num_requests_waiting:
        batch = (f"max_num_seqs caps the batch: with max_num_seqs={c.config.max_num_seqs}, "
                 f"{c.peak_num_requests_running} ran and {c.peak_num_requests_waiting} waited "
                 f"(B: max_num_seqs={b.config.max_num_seqs}); {versus(b, c)}")
    elif not c.peak_num_requests_running:   # no read of /metrics landed while requests ran
        batch = (f"max_num_seqs={c.config.max_num_seqs}: /metrics answered "
                 f"{c.num_metrics_samples} time(s) during C's load and never showed a request "
                 f"running, so whether it capped the batch was not observed in this run; "
                 f"{versus(b, c)}")
    else:
        batch = (f"max_num_seqs={c.config.max_num_seqs} capped nothing here: at most "
                 f"{c.peak_num_requests_running} of the {num_requests} requests ran at once and "
                 f"none was seen waiting; {versus(b, c)}")
    if c.num_kv_blocks is None:   # an engine that does not export its block count
        return [context, shorter, batch]
    same = c.num_kv_blocks == b.num_kv_blocks
    memory = (f"max_num_seqs divides no memory: C's KV cache is "
              f"{'the same ' if same else ''}{c.num_kv_blocks} blocks"
              + ("" if same else f" against B's {b.num_kv_blocks}")
              + "; it only caps how many requests one engine step serves")
    return [context, shorter, batch, memory]


def main(argv: list[str] | None = None) -> Tuning:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    check_fits(args, model)
    report.title("Task 7: Tuning vLLM Parameters for Production")
    report.run_info(model, dtype, settings.num_cores())
    report.row("Benchmark", f"{args.requests} concurrent requests per config, "
                            f"max_tokens={args.max_tokens}")
    report.row("Fixed for every config", f"kv_cache_memory_bytes={settings.KV_CACHE_BYTES}, "
                                         f"enforce_eager=True")
    runs = [benchmark(args, config) for config in CONFIGS]
    print_comparison(runs, args.requests, args.port)
    report.insight(insights(runs, args.requests))
    record = Tuning(header=results.RunHeader.of(model, dtype, settings.num_cores()),
                    num_requests=args.requests, max_tokens=args.max_tokens,
                    kv_cache_memory_bytes=settings.KV_CACHE_BYTES, configs=runs)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sum(r.level.num_failed for r in runs))
    return record


if __name__ == "__main__":
    cli.run(main)
