"""Task 7: Tuning vLLM Parameters for Production.

Benchmarks three server configurations with the same load, 10 concurrent requests of 50 tokens,
restarting the lab's server for each (the restart time is shown):

    A: Default              max_model_len=128, max_num_seqs=256
    B: Shorter Context      max_model_len=64,  max_num_seqs=256
    C: Limited Concurrency  max_model_len=64,  max_num_seqs=8

Beside throughput and latency, each row shows what the engine reports on /metrics: its KV
capacity (tokens, max concurrency at max_model_len) and the most requests that ran at once and
waited, sampled during the run. The server is left running with the last config.

    python task_7_tuning.py [--requests 10] [--max-tokens 50] [--model M] [--port 8000]
"""
from __future__ import annotations

from dataclasses import dataclass

from common import cli, load, metrics, report, results, settings

SCRIPT = "task_7_tuning"


@dataclass(frozen=True)
class TuningConfig:
    label: str
    max_model_len: int
    max_num_seqs: int


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


def benchmark(args, config: TuningConfig) -> dict:
    report.section(f"CONFIG {config.label}")
    srv, model, dtype = cli.lab_server(args, max_num_seqs=config.max_num_seqs,
                                       max_model_len=config.max_model_len)
    restart = f"{srv.state}, ready after {srv.startup_s:.1f} s" if srv.startup_s else srv.state
    report.row("Server", f"{srv.config.describe()}")
    report.row("  state", restart)
    text = metrics.fetch(srv.base_url)
    cache = metrics.info_labels(text, "vllm:cache_config")
    kv_tokens = int(cache["kv_cache_size_tokens"])
    max_concurrency = float(cache["kv_cache_max_concurrency"])
    load.run_level(srv.base_url, srv.model_name, load.user_prompts(1), args.max_tokens)  # warm-up
    with metrics.Sampler(srv.base_url) as sampler:
        level = load.run_level(srv.base_url, srv.model_name, load.user_prompts(args.requests),
                               args.max_tokens)
    report.row("KV capacity (engine)", f"{kv_tokens:,} tokens, {max_concurrency:.2f}x requests of "
                                       f"{config.max_model_len} tokens")
    report.row("Result", f"{level.throughput:.1f} tok/s, {level.latency_stat('latency_s'):.2f}s avg "
                         f"latency, {len(level.ok)}/{args.requests} ok")
    report.row("Requests at once (peak)", f"{sampler.max_running} running, {sampler.max_waiting} "
                                          f"waiting ({sampler.num_samples} samples of /metrics)")
    return {"label": config.label, "max_model_len": config.max_model_len,
            "max_num_seqs": config.max_num_seqs, "server_state": srv.state,
            "startup_s": round(srv.startup_s, 2) if srv.startup_s else None,
            "kv_cache_tokens": kv_tokens, "kv_max_concurrency": max_concurrency,
            "kv_block_size": int(cache["block_size"]),
            "peak_running": sampler.max_running, "peak_waiting": sampler.max_waiting,
            "metrics_samples": sampler.num_samples, **level.summary(),
            "model": model.name, "model_source": model.source, "dtype": dtype.dtype}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report.title("Task 7: Tuning vLLM Parameters for Production")
    report.row("Benchmark", f"{args.requests} concurrent requests per config, "
                            f"max_tokens={args.max_tokens}")
    report.row("Fixed for every config", f"kv_cache_memory_bytes={settings.KV_CACHE_BYTES}, "
                                         f"enforce_eager=True, {settings.num_cores()} cores")
    rows = [benchmark(args, config) for config in CONFIGS]
    report.row("dtype", f"{rows[0]['dtype']}; model {rows[0]['model']} ({rows[0]['model_source']})")

    report.section("CONFIGURATION COMPARISON")
    report.table(["Config", "len", "seqs", "KV tok", "conc.", "run/wait", "tok/s", "Lat(s)", "OK"],
                 [(r["label"], r["max_model_len"], r["max_num_seqs"], f"{r['kv_cache_tokens']:,}",
                   f"{r['kv_max_concurrency']:.0f}x", f"{r['peak_running']}/{r['peak_waiting']}",
                   f"{r['throughput_tok_s']:.1f}", f"{r['mean_latency_s']:.2f}",
                   f"{r['succeeded']}/{args.requests}") for r in rows],
                 widths=[24, 5, 6, 8, 7, 10, 8, 8, 7])
    report.note("len = max_model_len, seqs = max_num_seqs, conc. = max concurrency at len, "
                "run/wait = peak requests running/waiting")
    report.note(f"Server left running with config {CONFIGS[-1].label} on :{args.port}; "
                f"`make stop` stops it (task 5 restarts the default).")
    a, b, c = rows
    if b["kv_max_concurrency"] > a["kv_max_concurrency"]:
        context_line = (f"max_model_len sets the KV memory per request: 128 -> 64 tokens took the "
                        f"engine from {a['kv_max_concurrency']:.0f}x to "
                        f"{b['kv_max_concurrency']:.0f}x requests at once")
    else:   # vLLM's CPU backend allocates 128-token blocks: a 64-token request still holds one
        context_line = (f"max_model_len sets the KV memory per request, in whole "
                        f"{b['kv_block_size']}-token blocks here: 64 tokens still hold one block, "
                        f"so B fits no more requests than A ({b['kv_max_concurrency']:.0f}x)")
    report.insight([
        context_line,
        f"max_num_seqs caps the batch: with 8, {c['peak_running']} ran and {c['peak_waiting']} "
        f"waited, {c['throughput_tok_s']:.1f} vs {b['throughput_tok_s']:.1f} tok/s",
        "Both are knobs that divide the same KV-cache budget",
    ])
    data = {"model": rows[0]["model"], "model_source": rows[0]["model_source"],
            "dtype": rows[0]["dtype"], "threads": settings.num_cores(),
            "settings": {"requests": args.requests, "max_tokens": args.max_tokens,
                         "kv_cache_memory_bytes": settings.KV_CACHE_BYTES},
            "configs": rows}
    print(f"Saved: {results.save(SCRIPT, data)}")
    return data


if __name__ == "__main__":
    cli.run(main)
