"""What the tests share, written once: the repository's paths and the lab's constants, running a
script the way a learner does (a subprocess) and reading what it saved, the checks several files
make (a report's width, an insight line's figures and choice), the engine tests' engine, the
results built by hand that the lab-wide tests draw from, and the real-model run of the whole lab
in two parts that conftest.py's fixtures hand out (LabParts). Fixtures and pytest's hooks are in
conftest.py; records built by hand, one module a step, in tests/hand/. Helpers, not tests: a test
file imports them, never another test file (tests/lab/test_layout.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:   # imported where they are used: conftest.py imports this module at collection
    from common import results
    from common.load import LoadLevel
    from mini_engine import LLMEngine

REPO = Path(__file__).resolve().parent.parent
QUICK_TOKENS = 10     # --quick (common/steps.py): tasks 1, 2, 5, 6 and 7 make 10 tokens each
# KV bytes a token of SmolLM-135M: 2 (K,V) x 30 layers x 3 kv heads x 64 dims x 2 or 4 bytes
BYTES_PER_TOKEN = {"bfloat16": 23_040, "float32": 46_080}
# SmolLM-135M's config.json (the source's model; SmolLM2-135M has the same shapes)
SMOLLM = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
          "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
          "vocab_size": 49152, "tie_word_embeddings": True}


# --- a script run as a learner runs it ------------------------------------------------------------
def run_script(script: str, *args: str, env: dict | None = None, timeout: int = 600):
    """Run a lab script as a learner would; returns the finished process (text output)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def saved_result(script: str) -> dict:
    return json.loads((Path(os.environ["LAB_RESULTS_DIR"]) / f"{script}.json").read_text())


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


# --- what a report says ---------------------------------------------------------------------------
def row_value(out: str, label: str) -> str:
    """The value of the report's row label in out, its wrapped lines joined: those under the
    value's column, or indented by 4 under the label where a long word (a path) moved it all
    there (common.report.row)."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{label}:"))
    value = [lines[at].removeprefix(f"{label}:")]
    for line in lines[at + 1:]:
        if not line.startswith("    "):
            break
        value.append(line)
    return " ".join(part.strip() for part in value if part.strip())


def assert_fits(text: str, width: int = 65) -> None:
    """Every line of a report fits the report's width (common.report.WIDTH)."""
    long = [line for line in text.splitlines() if len(line) > width]
    assert not long, f"{len(long)} line(s) wider than {width} columns: {long[:3]}"


def check_generation(r: dict, tokens: int = 50) -> None:
    """A saved result of task 1 or 2 made its tokens, timed with the warm-up left out."""
    assert r["generated_tokens"] == tokens
    assert r["total_time_s"] > 0 and r["tokens_per_s"] > 0   # the formula: test_reports, by hand
    assert r["warmup_excluded"] is True
    assert r["threads"] >= 1
    # 3 timed passes from the same seed; the time saved is the median one's
    times = r["pass_times_s"]
    assert len(times) == 3 and sorted(times)[1] == pytest.approx(r["total_time_s"], abs=1e-4)


# A KEY INSIGHT line is chosen from the figures it explains (STYLE.md: "if the figures had come
# out the other way, would the sentence change?"). Its test checks two things: that the line
# states the figures worked out by hand (each as the report formats it, unit included, in the
# order the sentence gives them), and that the code took the branch those figures choose: a
# phrase that only that branch's template prints is there, and the phrases that only the other
# branches print are not. The words around them are not asserted: rewording a template breaks no
# test, while a figure formatted otherwise, a figure of the wrong run or a condition turned round
# still does. Each choice is tested both ways: a test with the figures that choose one branch,
# and one with the figures that choose the other.
def assert_says(line: str, *figures: str, branch: str | tuple[str, ...] = (),
                not_branch: str | tuple[str, ...] = ()) -> None:
    """Assert that line states each of figures in the given order (each found after the end of
    the one before it, so a figure stated twice is asserted twice); that branch, a phrase only
    the chosen branch's template prints (a tuple of them where the line makes more than one
    choice), is in it; and that no phrase of not_branch (those only the other branches print)
    is. The failure shows the line and everything missing or out of place, all at once."""
    branch, not_branch = phrases(branch), phrases(not_branch)
    assert all(figures) and all(branch) and all(not_branch), "an empty phrase asserts nothing"
    problems, at = [], 0
    for i, figure in enumerate(figures):
        found = line.find(figure, at)
        if found >= 0:
            at = found + len(figure)
        elif figure in line:
            after = repr(figures[i - 1]) if i else "the start"
            problems.append(f"figure {figure!r} is there, but not after {after}")
        else:
            problems.append(f"figure {figure!r} is missing")
    problems += [f"branch {phrase!r} is missing: the code chose another sentence"
                 for phrase in branch if phrase not in line]
    problems += [f"the other branch's {phrase!r} is there" for phrase in not_branch
                 if phrase in line]
    if problems:
        raise AssertionError(f"the insight line\n    {line!r}\n"
                             + "\n".join(f"  - {problem}" for problem in problems))


def phrases(given: str | tuple[str, ...]) -> tuple[str, ...]:
    """One phrase given bare, or several: a tuple of them (never a string's characters)."""
    return (given,) if isinstance(given, str) else tuple(given)


# --- records by hand ------------------------------------------------------------------------------
def level(users: int, tokens_per_s: float, mean_tpot_s: float | None = None,
          **figures) -> LoadLevel:
    """A load level with the figures given, every user's request ok, every other figure at its
    zero (tests/hand/: fill). A level whose figures come from its requests: LoadLevel.of."""
    from common.load import LoadLevel
    from tests import hand

    return hand.fill(LoadLevel, num_users=users, num_ok=users, tokens_per_s=tokens_per_s,
                     mean_tpot_s=mean_tpot_s, **figures)


def save_hand_results() -> dict[str, results.Result]:
    """Every step's hand-built record (tests/hand/), saved as the scripts save them, each with
    its own header, and the summary (its roofline placed by roofline.place from them); returns
    them as loaded back, as the report page reads them."""
    import summary
    from common import html_report, machine, results, steps
    from lessons.summary import roofline
    from lessons.summary.record import Summary
    from tests import hand

    hand.save_all()
    res, _ = steps.load_all()
    cost = machine.model_cost(SMOLLM, "float32", 4)
    figures = machine.Machine(20e9, {"float32": 100e9, "bfloat16": 0.3e9}, threads=2)
    floor = machine.KernelFloor("float32", 2, cost.matmul_params, {1: 0.070, 20: 0.180})
    record = Summary(header=results.RunHeader("SmolLM2-135M-Instruct", dtype="float32"),
                     roofline=roofline.place(summary.measured_steps(res), cost, figures, 70,
                                             floor),
                     engine_point=summary.engine_point(res, "float32"))
    results.save("summary", record)
    loaded, stale = steps.load_all(html_report.sections())
    assert stale == {}
    return loaded


# --- the engine tests' models and engine ----------------------------------------------------------
SMALL_VOCAB = 1024   # the engine tests draw their token ids from it (test_engine_properties.py)
PAGE = 4             # the engine tests' page: a few tokens fill one, so a case crosses pages
ROOMY = 4096         # EngineConfig's default token budget: never binds on these small cases


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


def engine(model, *, num_pages: int = 64, page_size: int = PAGE, budget: int = ROOMY,
           max_batch: int = 4, max_model_len: int = 64, chunking: bool = True,
           caching: bool = False, k: int = 0, n: tuple[int, int] = (2, 4), eos: tuple = (),
           **config) -> LLMEngine:
    """An LLMEngine on model with a pool of num_pages pages of page_size tokens, whatever its KV
    bytes a token: budget (max_num_batched_tokens), chunking (enable_chunked_prefill), caching
    (enable_prefix_caching), k guesses a step from n-grams of n = (min, max) tokens (0: no
    speculation), eos the end-of-sequence ids; any other EngineConfig setting by its name. A
    file whose cases share other defaults sets them once: functools.partial(engine, ...)."""
    from mini_engine import EngineConfig, LLMEngine

    return LLMEngine(model, list(eos), EngineConfig(
        kv_bytes=num_pages * page_size * model.kv_bytes_per_token, page_size=page_size,
        max_batch=max_batch, max_model_len=max_model_len, max_num_batched_tokens=budget,
        enable_chunked_prefill=chunking, enable_prefix_caching=caching,
        num_speculative_tokens=k, prompt_lookup_min=n[0], prompt_lookup_max=n[1], **config))


# --- a tiny-model server that speculates (conftest.py: speculating_server) ----------------------
SPECULATING = '{"method": "ngram", "num_speculative_tokens": 3}'   # vLLM's ngram at k = 3


# --- the whole lab on the real model, run once, in two parts --------------------------------------
LAB_GROUP = "the_whole_lab"     # the xdist_group of the lab-wide checks of its run


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
    waits on the other: the steps that share the lab's server and the first half of those that
    run engines of their own, then the other half. Each of the latter starts and stops what it
    measures (the lab stops the shared server before the first), so they split anywhere; a
    half of them each keeps the two parts' lengths near each other (docs/tests.md). Results
    names, in the list's order (common/steps.py)."""
    from common import steps

    names = [step.name for step in steps.STEPS]
    first_own = next(i for i, step in enumerate(steps.STEPS) if step.own_engines)
    assert all(step.own_engines for step in steps.STEPS[first_own:]), \
        "a step sharing the lab's server after one that runs its own engines"
    cut = first_own + (len(names) - first_own) // 2
    return [names[:cut], names[cut:]]


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
    (conftest.py's pytest_collection_modifyitems gives each part's checks to one group), and
    `pytest -n 0` runs both, one after the other. The servers a part left are stopped at the
    end."""

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


# --- which worker runs what -----------------------------------------------------------------------
def file_group(item) -> str:
    """A test file's own xdist_group: its path under tests/ (lab/test_layout.py), so two rooms'
    files of the same name never share a group."""
    return item.nodeid.partition("::")[0].removeprefix("tests/")


def name_its_group(item) -> None:
    """The test's xdist_group after its id ("...::test_x@the_whole_lab"), which is how xdist's
    scheduler tells the groups apart. xdist 3.8 writes it into item._nodeid, which pytest 9.2 no
    longer reads (its ids live in item._id): without this, every test was dealt out on its own,
    a file's tests and the lab's checks landed on both workers, and the lab ran twice."""
    from _pytest.nodeid import coerce_node_id

    (group,) = {mark.args[0] for mark in item.iter_markers("xdist_group")}
    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def insight_fits(lines: list[str]) -> None:
    """The KEY INSIGHT within the lab's limits (common/report.py): at most MAX_INSIGHT_BULLETS
    bullets in MAX_INSIGHT_LINES printed lines, each bullet a whole sentence."""
    import contextlib
    import io

    from common import report

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        report.insight(lines)
    printed = out.getvalue().splitlines()[2:-1]       # within the rules, after "KEY INSIGHT:"
    assert len(lines) <= report.MAX_INSIGHT_BULLETS, lines
    assert len(printed) <= report.MAX_INSIGHT_LINES, printed
    assert all(line.endswith(".") for line in lines), lines     # whole sentences


def insight_of(printed: str) -> list[str]:
    """The KEY INSIGHT's printed lines, between its heading and its closing rule."""
    lines = printed.splitlines()
    start = lines.index("KEY INSIGHT:") + 1
    return lines[start:lines.index("=" * 65, start)]


def report_fits(printed: str, room: int = 0) -> None:
    """A printed report within the lab's limits (common/report.py), with room lines to spare
    (a hand record's report lacks the header and progress lines of a real run)."""
    from common import report

    insight = insight_of(printed)
    assert len(insight) <= report.MAX_INSIGHT_LINES, insight
    assert sum(line.startswith("- ") for line in insight) <= report.MAX_INSIGHT_BULLETS
    assert len(printed.splitlines()) <= report.MAX_LINES - room
