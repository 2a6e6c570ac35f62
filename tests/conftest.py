"""Shared fixtures: a tiny model the tests build themselves, and a way to run a script the
way a learner does (a subprocess), with results written to a temporary folder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path, monkeypatch):
    """No test writes into the learner's results/ folder."""
    monkeypatch.setenv("LAB_RESULTS_DIR", str(tmp_path / "results"))


@pytest.fixture(autouse=True, scope="session")
def _server_state_in_tmp(tmp_path_factory):
    """The servers the tests start keep their state and log (server-<port>.json/.log) in a folder
    of the test session, never in .cache/ beside a learner's running lab. One folder for the
    session, so a server one test starts, the next can reuse."""
    old = os.environ.get("LAB_SERVER_DIR")
    os.environ["LAB_SERVER_DIR"] = str(tmp_path_factory.mktemp("servers"))
    yield
    if old is None:
        os.environ.pop("LAB_SERVER_DIR", None)
    else:
        os.environ["LAB_SERVER_DIR"] = old


def assert_fits(text: str, width: int = 65) -> None:
    """Every line of a report fits the report's width (common.report.WIDTH)."""
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, f"{len(long)} line(s) wider than {width} columns: {long[:3]}"


class PipeReader:
    """Reads a running process's stdout and stderr into lists as they come, one thread per pipe
    (communicate() would race a second reader for the lines), so a test can watch the output
    while the process runs, then wait() for the rest."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self.out.extend, args=(proc.stdout,), daemon=True),
                         threading.Thread(target=self.err.extend, args=(proc.stderr,), daemon=True)]
        for thread in self._threads:
            thread.start()

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the process has ended and both pipes are read."""
        self.proc.wait(timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=30)
        return self.proc.returncode, "".join(self.out), "".join(self.err)


def run_script(script: str, *args: str, env: dict | None = None, timeout: int = 600):
    """Run a lab script as a learner would; returns the finished process (text output)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def saved_result(script: str) -> dict:
    return json.loads((Path(os.environ["LAB_RESULTS_DIR"]) / f"{script}.json").read_text())


@pytest.fixture(scope="session")
def real_model():
    """The lab's own model choice (the packaged offline model on a machine with no hub)."""
    from common.model import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, real_model) -> str:
    """A 2-layer Llama with random weights and the real tokenizer: the real code paths of
    transformers and vLLM in a few seconds. head_dim 64 is one the vLLM CPU attention supports."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(real_model.path)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def pytest_configure(config):
    """With pytest -n N (pytest-xdist; pytest.ini asks for 2), each worker and every process it
    starts get their own share of the cores, as on a smaller machine. On 2 cores (AMD EPYC, AVX2,
    2026-11-30) the suite took 6.4 min so, 8.9-9.1 min with both workers on both cores (the lab's
    test: 345 s on a core of its own, 507 s sharing both; why was not measured: two OpenMP thread
    pools on the same cores is the likely cause), and 10.8-11.9 min in one process."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")              # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker and len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw"))::count])


def pytest_collection_modifyitems(items):
    """The real-model run of the whole lab first: it is the longest test by far (about half the
    suite), so one worker runs it while the other runs the rest."""
    items.sort(key=lambda item: item.get_closest_marker("real_model") is None)
