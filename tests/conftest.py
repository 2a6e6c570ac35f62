"""What the tests share, so that no test file stands on another (tests/test_layout.py): a tiny
model the tests build themselves, a way to run a script the way a learner does (a subprocess)
with results written to a temporary folder, the helpers several files use, the real-model run of
the whole lab (lab_run), a tiny-model server that speculates (speculating_server), and which
worker runs what (pytest_collection_modifyitems). Records built by hand: tests/hand/."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
QUICK_TOKENS = 10     # --quick (common/steps.py): tasks 1, 2, 5, 6 and 7 make 10 tokens each
# KV bytes a token of SmolLM-135M: 2 (K,V) x 30 layers x 3 kv heads x 64 dims x 2 or 4 bytes
BYTES_PER_TOKEN = {"bfloat16": 23_040, "float32": 46_080}
LAB_GROUP = "the_whole_lab"     # the xdist_group of the lab-wide checks of its run


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


def check_generation(r: dict, tokens: int = 50) -> None:
    """A saved result of task 1 or 2 made its tokens, timed with the warm-up left out."""
    assert r["generated_tokens"] == tokens
    assert r["total_time_s"] > 0 and r["tokens_per_s"] > 0   # the formula: test_reports, by hand
    assert r["warmup_excluded"] is True
    assert r["threads"] >= 1
    # 3 timed passes from the same seed; the time saved is the median one's
    times = r["pass_times_s"]
    assert len(times) == 3 and sorted(times)[1] == pytest.approx(r["total_time_s"], abs=1e-4)


def processes_on_port(port: int) -> list[int]:
    """PIDs of any process whose command line has --port <port> (the server or its child)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--port" in cmdline and str(port).encode() in cmdline:
            pids.append(int(pid))
    return pids


def chromium():
    """Headless Debian chromium through its own chromedriver (`make test` installs both)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in ("/usr/bin/chromium", "/usr/bin/chromedriver"):
        assert Path(path).exists(), f"{path} is missing: run `make browser` (apt-get install " \
                                    f"chromium chromium-driver)"
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="lab-chromium-")
    # no background networking: this machine has no network, and the page needs none
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                 "--window-size=1400,1300"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})   # the console, for get_log
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    return driver, profile


@pytest.fixture(scope="session")
def real_model():
    """The lab's own model choice (the packaged offline model on a machine with no hub)."""
    from common.model import resolve_model

    return resolve_model()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, real_model) -> str:
    """A 2-layer Llama with random weights and the real tokenizer: the real code paths of
    transformers and vLLM in a few seconds. head_dim 64 is one the vLLM CPU attention supports."""
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(real_model.path)
    save_tiny_llama(out, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    tokenizer.save_pretrained(out)
    return str(out)


def save_tiny_llama(out: Path, vocab_size: int, bos_token_id: int, eos_token_id: int) -> None:
    """The tiny models' one shape (2 layers, hidden 128, 2 heads over 1 KV head of 64, tied
    embeddings), random weights from seed 0, saved as an HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=64, max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=bos_token_id, eos_token_id=eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)


# --- the engine tests' model: tiny_model's shape with a small vocabulary -----------------------
SMALL_VOCAB = 1024   # the engine tests draw their token ids from it (test_engine_properties.py)


@pytest.fixture(scope="session")
def small_vocab_model(tmp_path_factory) -> str:
    """tiny_model's shape (2 layers, random weights, tied embeddings) with a vocabulary of 1,024
    instead of 49,152, and no tokenizer: for the tests that drive mini_engine with token ids. The
    LM head over 49,152 rows is most of a step of tiny_model (5.2 ms a step, 0.72 ms with 1,024
    rows, measured), so the engine tests search as many cases in a fraction of the time. A test
    that needs the real tokenizer keeps tiny_model. A real HF folder: transformers loads it."""
    out = tmp_path_factory.mktemp("small-vocab-llama")
    save_tiny_llama(out, SMALL_VOCAB, bos_token_id=1, eos_token_id=2)
    return str(out)


@pytest.fixture(scope="session")
def tiny_llama(small_vocab_model):
    """mini_engine's Llama (fp32) on small_vocab_model, one for the session: shared by every
    engine test, which is safe as each LLMEngine allocates its own KV pool (the model holds
    none) and no test changes the model (a test that needs other weights builds its own)."""
    from mini_engine import Llama

    return Llama(small_vocab_model)


# --- the whole lab on the real model, run once, in two parts --------------------------------------
@dataclass
class LabRun:
    """One `python lab.py --quick --steps ...` on a port of its own, its results in a folder of its
    own: one part of the lab (lab_parts)."""
    port: int
    proc: subprocess.CompletedProcess
    results_dir: Path

    @property
    def out(self) -> str:
        """The lab's output with its whitespace folded: a line wrapped at 65 reads as one."""
        return " ".join(self.proc.stdout.split())

    def saved(self, name: str) -> dict:
        """results/<name>.json of this run; a clear failure when the lab never saved it."""
        path = self.results_dir / f"{name}.json"
        if not path.exists():
            pytest.fail(f"the lab saved no {path.name}: it stopped before that step (see "
                        f"test_the_lab_runs_every_step_to_the_end)", pytrace=False)
        return json.loads(path.read_text())

    def step(self, name: str) -> dict:
        """What lab_run.json recorded of the step <name> (results name): its args, exit code,
        seconds, peak memory and processes."""
        return next(s for s in self.saved("lab_run")["steps"] if Path(s["script"]).stem == name)

    def args(self, name: str) -> list[str]:
        """The arguments the lab ran the step <name> with."""
        return self.step(name)["args"]

    def row(self, name: str) -> str:
        """The summary's figure for the step <name>, as the lab's summary saved it."""
        from common import steps

        number = steps.by_name()[name].number
        return next(r["figure"] for r in self.saved("summary")["rows"] if r["step"] == number)

    def write(self, path: Path) -> None:
        """Written whole or not at all, for a worker that waits for it (LabParts)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": self.port, "results_dir": str(self.results_dir),
                                   "returncode": self.proc.returncode,
                                   "stdout": self.proc.stdout, "stderr": self.proc.stderr}))
        tmp.rename(path)

    @classmethod
    def read(cls, path: Path) -> "LabRun":
        d = json.loads(path.read_text())
        return cls(d["port"], subprocess.CompletedProcess("lab.py", d["returncode"], d["stdout"],
                                                          d["stderr"]), Path(d["results_dir"]))


def lab_parts() -> list[list[str]]:
    """The quick lab in two runs of lab.py (its hidden --steps), one on each worker, so neither
    waits on the other: the steps up to the first that runs engines of its own (they share the
    lab's server, which the lab stops before that one: task 9), then the rest (each starts and
    stops what it runs). Results names, in the list's order (common/steps.py)."""
    from common import steps

    names = [step.name for step in steps.STEPS]
    first_own = next(i for i, step in enumerate(steps.STEPS) if step.own_engines)
    return [names[:first_own + 1], names[first_own + 1:]]


def part_of(names) -> int:
    """The one part of the lab that ran every step named (results names)."""
    parts = lab_parts()
    found = {i for i, part in enumerate(parts) for name in names if name in part}
    assert len(found) == 1 and all(any(name in part for part in parts) for name in names), \
        f"{names}: not steps of one part of the lab ({parts})"
    return found.pop()


class LabParts:
    """The parts of the lab for this pytest run, each run once whichever worker asks first: it
    claims the part (a file created only if it does not exist), runs it and writes down where its
    results are; a worker that asks later waits for that. So a part runs where its checks run
    (pytest_collection_modifyitems gives each part's checks to one group), and `pytest -n 0`
    runs both, one after the other. The servers a part left are stopped at the end."""

    def __init__(self, shared: Path):
        self.shared = shared
        self.mine: dict[int, LabRun] = {}

    def get(self, i: int) -> LabRun:
        if i in self.mine:
            return self.mine[i]
        done = self.shared / f"lab-part-{i}.json"
        try:
            os.close(os.open(self.shared / f"lab-part-{i}.claimed", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return self._wait_for(done)
        try:
            self.mine[i] = run = self._run(i)
        except BaseException as e:   # whoever waits is told, not left waiting for 25 minutes
            failed = subprocess.CompletedProcess("lab.py", -1, "", f"{type(e).__name__}: {e}")
            self.mine[i] = run = LabRun(0, failed, self.shared / f"lab-part-{i}-results")
            raise
        finally:
            run.write(done)
        return run

    def _run(self, i: int) -> LabRun:
        from common import server, steps

        port = server.free_port()
        results_dir = self.shared / f"lab-part-{i}-results"
        scripts = ",".join(steps.by_name()[name].script for name in lab_parts()[i])
        try:
            proc = run_script("lab.py", "--port", str(port), "--quick", "--steps", scripts,
                              timeout=1200, env={"LAB_RESULTS_DIR": str(results_dir)})
        except subprocess.TimeoutExpired as e:   # its output so far comes as bytes
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
            proc = subprocess.CompletedProcess(e.cmd, -9, out, "lab.py timed out after 1200 s")
        return LabRun(port, proc, results_dir)

    @staticmethod
    def _wait_for(done: Path, timeout_s: float = 1500) -> LabRun:
        deadline = time.monotonic() + timeout_s
        while not done.exists():
            assert time.monotonic() < deadline, f"no {done.name} after {timeout_s:.0f} s"
            time.sleep(1)
        return LabRun.read(done)

    def stop(self) -> None:
        from common import server

        for run in self.mine.values():
            server.stop_server(run.port)


@pytest.fixture(scope="session")
def _lab_parts(tmp_path_factory) -> Iterator[LabParts]:
    # one folder for the whole pytest run: the workers' own (popen-gw0, ...) share a parent
    base = tmp_path_factory.getbasetemp()
    parts = LabParts(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    try:
        yield parts
    finally:
        parts.stop()


@pytest.fixture
def lab_run(request, _lab_parts) -> LabRun:
    """The part of the real-model lab that ran the steps this test checks, as its mark names
    them (@pytest.mark.lab_steps("task_9_build_your_own_engine")): run once for every test that
    asks for it, each in the test file of what it checks (test_task_9.py holds task 9's). A
    server it left is stopped at the end, whatever happened (test_the_lab_leaves_no_process_on_
    its_ports checks that the lab left none). pytest_collection_modifyitems marks these
    real_model and puts each part's in one group, first."""
    return _lab_parts.get(part_of(request.node.get_closest_marker("lab_steps").args))


@pytest.fixture
def whole_lab(_lab_parts) -> list[LabRun]:
    """Every part of the real-model lab, in the order of the steps: for the lab-wide checks
    (tests/test_lab.py), which run last."""
    return [_lab_parts.get(i) for i in range(len(lab_parts()))]


# --- a tiny-model server the --base-url tests share ---------------------------------------------
SPECULATING = '{"method": "ngram", "num_speculative_tokens": 3}'   # vLLM's ngram at k = 3


@pytest.fixture(scope="session")
def speculating_server(tiny_model, _server_state_in_tmp):
    """A tiny-model server on a free port, speculating with vLLM's ngram at k = 3, started once
    for the tests that use a server given by --base-url (tasks 11 and 12: each marks itself
    xdist_group("speculating_server"), so both run on the worker that started it); stopped at
    the end of the session, and nothing left on its port. Yields its ServerConfig."""
    from common import server

    port = server.free_port()
    config = server.ServerConfig(tiny_model, "tiny", "float32", max_model_len=256,
                                 max_num_seqs=16, port=port,
                                 engine_args=("--speculative-config", SPECULATING))
    try:
        server.ensure_server(config)
        yield config
    finally:
        server.stop_server(port)
    assert processes_on_port(port) == []


def pytest_configure(config):
    """With pytest -n N (pytest-xdist; pytest.ini asks for 2), each worker and every process it
    starts get their own share of the cores, as on a smaller machine: two workers sharing both
    cores ran the suite slower than one core each (two OpenMP thread pools on the same cores is
    the likely cause, not measured; the figures are in docs/measurements.md)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")              # gw0, gw1, ...
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker and len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw"))::count])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Which worker runs what, under pytest.ini's --dist loadgroup (xdist deals out whole
    xdist_group's, in this order, the next to the first worker with two tests or fewer left):
    - each part of the lab's run (lab_parts) is one group, the checks of its steps (the tests
      that take lab_run, in whichever file, marked lab_steps), marked real_model and engine;
      the two go first, so each worker starts on one: they are the longest by far;
    - the lab-wide checks (those that take whole_lab) are one group, last: by then both parts
      are done, so no worker waits for the other;
    - every other test without a group of its own is grouped by its file, so a file's tests
      share a worker and its module-scoped server, as --dist loadfile had them.
    tryfirst: before xdist's own hook, which reads the xdist_group marks (xdist/remote.py), and
    before -m reads real_model."""
    rank = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "lab_run" in fixtures or "whole_lab" in fixtures:
            item.add_marker(pytest.mark.real_model)
            item.add_marker(pytest.mark.engine)
            group, rank[id(item)] = LAB_GROUP, 2
            if "lab_run" in fixtures:
                mark = item.get_closest_marker("lab_steps")
                if mark is None:
                    raise pytest.UsageError(f"{item.nodeid} takes lab_run: name the steps it "
                                            f"checks, @pytest.mark.lab_steps(...)")
                part = part_of(mark.args)
                group, rank[id(item)] = f"lab_part_{part}", part / 10
            item.add_marker(pytest.mark.xdist_group(group))
        elif item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
        if getattr(config.option, "loadgroup", False):       # on an xdist worker
            _name_its_group(item)
    items.sort(key=lambda item: rank.get(id(item), 1))   # stable: files keep their order


def _name_its_group(item) -> None:
    """The test's xdist_group after its id ("...::test_x@the_whole_lab"), which is how xdist's
    scheduler tells the groups apart. xdist 3.8 writes it into item._nodeid, which pytest 9.2 no
    longer reads (its ids live in item._id): without this, every test was dealt out on its own,
    a file's tests and the lab's checks landed on both workers, and the lab ran twice (a fresh
    clone's make test, 2026-12-01: 10.8 min)."""
    from _pytest.nodeid import coerce_node_id

    (group,) = {mark.args[0] for mark in item.iter_markers("xdist_group")}
    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")
