"""The three servers task 15 puts under one load, and how each is started and stopped.

    vLLM           the lab's server (common/server.py), the lab's settings
    mini_engine    python -m mini_engine.server, the same engine settings
    transformers   transformers serve --continuous-batching, HF's own paged continuous
                   batching, its KV pool the lab's budget in pages of the lab's size

Each runs alone (two cores cannot host two), in a session of its own, its log in the lab's
server folder; whatever started it stops it, also on Ctrl-C, and nothing is left on its port.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common import server, settings
from common.shape import ModelShape

WAYS = ("vLLM", "mini_engine", "transformers")


@dataclass(frozen=True)
class Settings:
    """The engine settings the lab's vLLM server runs with, given to mini_engine's too."""
    max_model_len: int = settings.MAX_MODEL_LEN
    max_num_seqs: int = 256
    block_size: int = settings.BLOCK_SIZE
    kv_cache_bytes: int = settings.KV_CACHE_BYTES
    prefix_caching: bool = True

    def describe(self) -> str:
        return (f"max_model_len={self.max_model_len}, max_num_seqs={self.max_num_seqs}, "
                f"block_size={self.block_size}, kv_cache_memory_bytes={self.kv_cache_bytes}, "
                f"prefix caching {'on' if self.prefix_caching else 'off'}")


def mini_engine_command(model_path: str, name: str, dtype: str, port: int, s: Settings,
                        kernels: str = "c", extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "mini_engine.server", "--model", model_path,
            "--served-model-name", name, "--port", str(port), "--dtype", dtype,
            "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--block-size", str(s.block_size), "--kv-cache-memory-bytes", str(s.kv_cache_bytes),
            "--seed", str(settings.SEED), "--kernels", kernels,
            "--enable-prefix-caching" if s.prefix_caching else "--no-enable-prefix-caching",
            *extra]


def transformers_blocks(model_path: str, dtype: str, s: Settings) -> int:
    """The lab's KV budget as transformers' blocks of block_size tokens (every layer's K and V):
    left to itself it takes most of the machine's memory (11 GB here)."""
    per_token = ModelShape.from_folder(model_path).kv_bytes_per_token(dtype)
    return s.kv_cache_bytes // (s.block_size * per_token)


def transformers_command(model_path: str, dtype: str, port: int, s: Settings) -> list[str]:
    # the model is preloaded (the positional argument), and clients ask for it by its path
    return [str(Path(sys.executable).with_name("transformers")), "serve", model_path,
            "--continuous-batching", "--device", "cpu", "--dtype", dtype,
            "--cb-block-size", str(s.block_size),
            "--cb-num-blocks", str(transformers_blocks(model_path, dtype, s)),
            "--host", "127.0.0.1", "--port", str(port)]


class Started:
    """A server process this run started: `with Started(...) as srv:` waits until /health
    answers, and stops its whole process group on the way out, however it is left."""

    def __init__(self, way: str, command: list[str], port: int, timeout_s: float = 300,
                 progress: Callable[[str], None] = print):
        self.way, self.command, self.port = way, command, port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = settings.server_state_dir() / f"{way}-{port}.log"
        self.timeout_s, self.progress = timeout_s, progress
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0

    def __enter__(self) -> "Started":
        if server.port_in_use("127.0.0.1", self.port):
            raise server.ServerError(f"port {self.port} is in use by another program")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **settings.ENGINE_ENV}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True, cwd=settings.REPO_DIR)
        try:
            self.startup_s = server.wait_until_healthy(
                self.proc, self.base_url, self.way, self.log_path, self.timeout_s,
                lambda line: self.progress(f"  {line}"))
        except BaseException:        # ServerError, Ctrl-C, SIGTERM: stop what was started
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            server.kill_group(self.proc.pid)
            self.proc = None

    def __exit__(self, *exc) -> None:
        self.stop()
