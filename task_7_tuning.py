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
the report's printing and insight (report.py), the figure (figure.py).

    python task_7_tuning.py [--requests 10] [--max-tokens 50] [--passes 3] [--model M]
        [--port 8000]
"""
from __future__ import annotations

from common import cli, figures, load, measure, metrics, report, results, settings
from lessons.task_7 import FIGURES
from lessons.task_7 import report as show
from lessons.task_7.record import ConfigRun, Tuning, TuningConfig

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
    show.print_server(srv, config)
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
    show.print_run(run, args.requests)
    return run


def run_passes(srv, num_requests: int, max_tokens: int, num_passes: int
               ) -> list[load.LoadLevel]:
    """The load, pass after pass on the same server; a pass in which a request failed is the
    last (the server is down or refusing: a pass more measures nothing)."""
    found = []
    print("  Passes (tok/s):", end="", flush=True)     # one line, a figure as each pass ends
    for p in range(num_passes):
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(num_requests),
                               max_tokens)
        found.append(level)
        print(f" {level.tokens_per_s:.1f}" + ("," if p + 1 < num_passes else ""), end="",
              flush=True)
        if level.num_failed:
            print(f" ({level.num_failed} failed: no more passes)", end="")
            break
    print(flush=True)
    return found


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
    show.print_comparison(runs, args.requests, args.port)
    report.detail_hint()
    report.insight(show.insights(runs, args.requests))
    record = Tuning(header=results.RunHeader.of(model, dtype, settings.num_cores()),
                    num_requests=args.requests, max_tokens=args.max_tokens,
                    kv_cache_memory_bytes=settings.KV_CACHE_BYTES, configs=runs)
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    cli.fail_if_any_failed(sum(r.level.num_failed for r in runs))
    return record


if __name__ == "__main__":
    cli.run(main)
