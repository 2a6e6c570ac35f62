"""Task 7: Tuning vLLM Parameters for Production.

Benchmarks three server configurations with the same load, 10 concurrent requests of 50 tokens,
restarting the lab's server for each (the restart time is shown):

    A: Default              max_model_len=128, max_num_seqs=256
    B: Shorter Context      max_model_len=64,  max_num_seqs=256
    C: Limited Concurrency  max_model_len=64,  max_num_seqs=8

Beside throughput and latency, each row shows what the engine reports on /metrics: its KV
cache (blocks x block size, max concurrency at max_model_len) and the most requests that ran at
once and waited, sampled during the run. Every KEY INSIGHT line is chosen from those figures. Any
failed request is counted in the report and makes the exit code 1; a --max-tokens that cannot
fit a config's max_model_len is refused before any server starts. The server is left running
with the last config.

    python task_7_tuning.py [--requests 10] [--max-tokens 50] [--model M] [--port 8000]
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common import cli, figures, kv, load, metrics, report, results, settings

SCRIPT = "task_7_tuning"


@dataclass(frozen=True)
class TuningConfig:
    label: str
    max_model_len: int
    max_num_seqs: int


@dataclass(frozen=True)
class ConfigRun:
    """One config's run: its KV cache and batch as the engine reported them on /metrics, and
    the load's figures (load.LevelResult.summary(), saved as they are)."""
    config: TuningConfig
    throughput_tok_s: float
    kv_max_concurrency: float          # requests of max_model_len the KV cache holds at once
    kv_blocks: int | None = None       # None: an engine that does not export its block count
    kv_block_size: int | None = None
    peak_running: int = 0              # most requests seen running / waiting during the load
    peak_waiting: int = 0
    mean_latency_s: float | None = None
    succeeded: int = 0
    failed: int = 0
    server_state: str = ""
    startup_s: float | None = None
    metrics_samples: int = 0
    load: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.config.label

    def to_dict(self) -> dict:
        return {"label": self.config.label, "max_model_len": self.config.max_model_len,
                "max_num_seqs": self.config.max_num_seqs, "server_state": self.server_state,
                "startup_s": self.startup_s, "kv_blocks": self.kv_blocks,
                "kv_block_size": self.kv_block_size, "kv_max_concurrency": self.kv_max_concurrency,
                "peak_running": self.peak_running, "peak_waiting": self.peak_waiting,
                "metrics_samples": self.metrics_samples, **self.load}


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
    warmup = load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)
    if warmup.num_failed:
        cli.fail(f"config {config.label}: the warm-up request failed: "
                 f"{warmup.requests[0].error}", code=1)
    with metrics.Sampler(srv.base_url) as sampler:
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(args.requests),
                               args.max_tokens)
    # blocks x block size, as task 8 shows it: the engine's own kv_cache_size_tokens label is its
    # max concurrency x max_model_len, which halves at max_model_len 64 for the same blocks
    if num_blocks and block_size:
        report.row("KV cache (engine)", f"{num_blocks} blocks x {block_size} tokens = "
                                        f"{num_blocks * block_size:,} tokens")
    report.row("  max concurrency", f"{max_concurrency:.2f}x requests of {config.max_model_len} "
                                    f"tokens")
    report.row("Result", f"{level.throughput:.1f} tok/s, "
                         f"{level.seconds(level.latency_stat('latency_s'))} s avg latency, "
                         f"{len(level.ok)}/{args.requests} ok")
    for error in level.errors:
        report.note(f"failed: {error}", indent=2)
    report.row("Requests at once (peak)", f"{sampler.max_running} running, {sampler.max_waiting} "
                                          f"waiting")
    report.note(f"(the most seen in {sampler.num_samples} reads of /metrics during the load)",
                indent=2)
    summary = level.summary()
    return ConfigRun(config, summary["throughput_tok_s"], max_concurrency, num_blocks, block_size,
                     sampler.max_running, sampler.max_waiting, summary["mean_latency_s"],
                     summary["succeeded"], summary["failed"], srv.state,
                     round(srv.startup_s, 2) if srv.startup_s else None, sampler.num_samples,
                     summary)


def insights(rows: list[ConfigRun], num_requests: int) -> list[str]:
    """The KEY INSIGHT lines, each from what configs A, B and C measured."""
    a, b, c = rows
    len_a, len_b = a.config.max_model_len, b.config.max_model_len
    if b.kv_max_concurrency > a.kv_max_concurrency:
        context = (f"max_model_len sets the KV memory per request: {len_a} -> "
                   f"{len_b} tokens took the engine from "
                   f"{a.kv_max_concurrency:.0f}x to {b.kv_max_concurrency:.0f}x requests "
                   f"at once")
    else:   # blocks of max_model_len or more (settings.BLOCK_SIZE; vLLM's CPU default is 128)
        block = b.kv_block_size
        context = (f"max_model_len sets the KV memory per request in whole {block}-token blocks: "
                   f"{len_b} tokens hold {kv.cdiv(len_b, block)} "
                   f"block(s), {len_a} tokens {kv.cdiv(len_a, block)}, "
                   f"so B fits {b.kv_max_concurrency:.0f}x requests at once, A "
                   f"{a.kv_max_concurrency:.0f}x")
    if c.peak_waiting:
        batch = (f"max_num_seqs caps the batch: with max_num_seqs={c.config.max_num_seqs}, "
                 f"{c.peak_running} ran and {c.peak_waiting} waited; "
                 f"{c.throughput_tok_s:.1f} tok/s against B's {b.throughput_tok_s:.1f} "
                 f"(max_num_seqs={b.config.max_num_seqs})")
    else:
        batch = (f"max_num_seqs={c.config.max_num_seqs} capped nothing here: at most "
                 f"{c.peak_running} of the {num_requests} requests ran at once and none was "
                 f"seen waiting")
    if c.kv_blocks is None:   # an engine that does not export its block count
        return [context, batch]
    same = c.kv_blocks == b.kv_blocks
    memory = (f"max_num_seqs divides no memory: C's KV cache is "
              f"{'the same ' if same else ''}{c.kv_blocks} blocks"
              + ("" if same else f" against B's {b.kv_blocks}")
              + "; it only caps how many requests one engine step serves")
    return [context, batch, memory]


def main(argv: list[str] | None = None) -> dict:
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
    rows = [benchmark(args, config) for config in CONFIGS]

    report.section("CONFIGURATION COMPARISON")
    report.table(["Cfg", "len", "seqs", "blocks", "conc.", "run/wait", "tok/s", "Lat(s)", "OK"],
                 [(r.label[0], r.config.max_model_len, r.config.max_num_seqs,
                   r.kv_blocks if r.kv_blocks is not None else "-",
                   f"{r.kv_max_concurrency:.0f}x", f"{r.peak_running}/{r.peak_waiting}",
                   f"{r.throughput_tok_s:.1f}",
                   "-" if r.mean_latency_s is None else f"{r.mean_latency_s:.2f}",
                   f"{r.succeeded}/{args.requests}") for r in rows],
                 widths=[4, 5, 6, 7, 7, 9, 8, 8, 7])
    report.note(f"len = max_model_len, seqs = max_num_seqs, blocks = KV blocks of "
                f"{rows[0].kv_block_size} tokens, conc. = max concurrency at len, run/wait = "
                f"peak requests running/waiting, Lat = mean latency")
    report.note(f"Server left running with config {CONFIGS[-1].label} on :{args.port}; "
                f"`make stop` stops it (task 5 restarts the default).")
    report.insight(insights(rows, args.requests))
    data = {"settings": {"requests": args.requests, "max_tokens": args.max_tokens,
                         "kv_cache_memory_bytes": settings.KV_CACHE_BYTES},
            "configs": [r.to_dict() for r in rows]}
    header = results.RunHeader.of(model, dtype, settings.num_cores())
    figures.saved(results.save(SCRIPT, header, results.Tuning.from_dict(data)))
    cli.fail_if_any_failed(sum(r.failed for r in rows))
    return header.__dict__ | data


if __name__ == "__main__":
    cli.run(main)
