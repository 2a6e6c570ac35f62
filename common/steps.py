"""The one list of the lab's steps. Whatever goes over the lab's steps reads it: `make lab`
(lab.py) runs them in this order with their arguments, then the summary (SUMMARY, named here the
same way); the summary (summary.py) prints their section-10 table (table_rows: their rows beside
the source's own figures) from their saved results (load_all); results/report.html
(common/html_report.py) shows the same table, then each step in this order with its figures,
then the summary's; and the tests check that every task_*.py is here and named in the README.

Each step's lesson is a package, lessons/<its script's name up to its number>/ (lessons/task_9/
for task_9_build_your_own_engine.py, lessons/verify_environment/, lessons/summary/), and its
__init__.py names what the lab reads back:

    RECORD        the dataclass its result is saved as (results/<name>.json) and read back into
    summary_row   RECORD -> the figure the summary's table shows for it
    FIGURES       ((file suffix, draw(RECORD) -> Figure), ...): its pictures

so adding a task is its script, its package and one entry here. The script imports its package
to save its result; the package is imported here only when one of those is asked for. The arrows
point one way: scripts import lessons/ and common/, lessons/ imports common/, and nothing imports
a top-level script (tests/test_layout.py).
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from common import results

PORT = "{port}"   # in args: replaced by the lab server's port


@dataclass(frozen=True)
class Step:
    script: str                                   # the file `make lab` runs
    number: str                                   # its number in the summary's table
    title: str                                    # what it shows, in the summary's table
    source: str | None = None                     # the source's own figure (its section 10)
    args: tuple[str, ...] = ()                    # its arguments in `make lab`
    quick_args: tuple[str, ...] = ()              # added by --quick (a later flag wins)
    own_engines: bool = False                     # runs engines of its own: the server stops

    @property
    def name(self) -> str:
        """Its results' name: results/<name>.json, .txt, .png: its script's name."""
        return Path(self.script).stem

    @property
    def label(self) -> str:
        """'task 6', or 'python verify_environment.py': what a learner runs again."""
        return f"task {self.number}" if self.name.startswith("task_") else f"python {self.script}"

    def command(self, port: int, quick: bool = False) -> list[str]:
        args = [str(port) if a == PORT else a for a in self.args]
        return [self.script, *args, *(self.quick_args if quick else ())]

    @property
    def package(self) -> str:
        """Its lesson's package: lessons.task_9 for task_9_build_your_own_engine.py, the whole
        name for a script without a number (lessons.verify_environment, lessons.summary)."""
        numbered = re.match(r"task_\d+", self.name)
        return f"lessons.{numbered.group() if numbered else self.name}"

    # --- what the lab reads back, from its lesson's package ----------------------------------
    @cached_property
    def lesson(self):
        """The step's lesson package (imported on first use)."""
        return importlib.import_module(self.package)

    @property
    def record(self) -> type[results.Result]:
        return self.lesson.RECORD

    @property
    def figures(self) -> tuple:
        return getattr(self.lesson, "FIGURES", ())

    def row(self, result: results.Result) -> str:
        return self.lesson.summary_row(result)

    def load(self) -> results.Result | None:
        """Its saved result, typed; None if never saved; StaleResult (one line) if this lab
        cannot read it."""
        return results.load(self.name, self.record, self.label)


STEPS: list[Step] = [
    Step("verify_environment.py", "0", "Environment check"),
    Step("task_1_hf_baseline.py", "1", "HuggingFace baseline", "10.5 tok/s",
         quick_args=("--max-tokens", "10")),
    Step("task_2_vllm_inference.py", "2", "vLLM, one request", "11.9 tok/s (1.1x)",
         quick_args=("--max-tokens", "10")),
    Step("task_3_kv_cache_problem.py", "3", "Contiguous KV allocation", "utilisation 20.3%"),
    Step("task_4_paged_attention.py", "4", "PagedAttention", "utilisation 95.4%, users 4.8x"),
    Step("task_5_api_server.py", "5", "OpenAI-compatible server", "/v1/completions, 3.83 s",
         args=("--port", PORT), quick_args=("--max-tokens", "10")),
    Step("task_6_multi_user_load.py", "6", "Concurrent users", "20 users 163.4 tok/s (12.6x)",
         args=("--port", PORT),
         quick_args=("--users", "1,20", "--max-tokens", "10", "--no-sequential")),
    Step("task_7_tuning.py", "7", "Parameter tuning", "A 95.2 / B 101.9 / C 53.6 tok/s",
         args=("--port", PORT), quick_args=("--max-tokens", "10")),
    # the snapshot while 20 requests run, so it shows a batch, not an idle server; 20 tokens
    # each keep 8 running for a few seconds (task 7 leaves max_num_seqs=8)
    Step("task_8_dashboard.py", "8", "Dashboard over /metrics",
         args=("--once", "--load", "20", "--max-tokens", "20", "--server-port", PORT)),
    # task 9 runs its own engines (its own, transformers', vLLM's in-process): the lab's server
    # that tasks 5-8 shared is stopped before it, so its ~2.2 GB is not charged to task 9
    Step("task_9_build_your_own_engine.py", "9", "Engine built from scratch",
         quick_args=("--requests", "8", "--mean-output", "8"), own_engines=True),
    # task 10 starts the lab's server itself, prefix caching on then off, and stops it after
    Step("task_10_prefix_caching.py", "10", "Prefix caching",
         args=("--port", PORT), quick_args=("--requests", "8", "--output", "4"),
         own_engines=True),
    # task 11 starts the lab's server itself, once without chunking and once per budget, and
    # stops it after; --quick: one budget and one shorter document, two server starts
    Step("task_11_chunked_prefill.py", "11", "Chunked prefill",
         args=("--port", PORT), quick_args=("--budgets", "64", "--chat-output", "16",
                                            "--long-docs", "1", "--long-tokens", "300",
                                            "--long-output", "8"),
         own_engines=True),
    # task 12 starts the lab's server itself, speculation off then on, and stops it after;
    # --quick: one k (4), 3 requests of 16 tokens, the same two server starts
    Step("task_12_speculative_decoding.py", "12", "Speculative decoding",
         args=("--port", PORT), quick_args=("--quick",), own_engines=True),
    # task 13 runs vLLM in processes of its own, eager then compiled; --quick: smaller
    # workloads, both compiles (mini_engine's and vLLM's) still run
    Step("task_13_compiled_step.py", "13", "Compiled step", "enforce_eager=True",
         quick_args=("--quick",), own_engines=True),
    # task 14 starts the lab's server itself, once per --kv-cache-dtype, and stops it after;
    # --quick: fewer prompts and requests, the model's dtype and fp8 only (two server starts)
    Step("task_14_quantized_kv.py", "14", "Quantized KV cache",
         args=("--port", PORT), quick_args=("--quick",), own_engines=True),
    # task 15 runs three servers one at a time (vLLM's on the lab's port), each then its engine
    # offline in a fresh process, and stops each; --quick: 2 levels of 10 tokens, one pass,
    # not vLLM's (tasks 5-14's quick steps run its server and its offline engine already), and
    # no offline runs (tests/tasks/test_task_15.py runs mini_engine's on the tiny model)
    Step("task_15_serve_your_engine.py", "15", "Your engine behind a server",
         "vLLM's server only", args=("--port", PORT),
         quick_args=("--users", "1,20", "--max-tokens", "10", "--passes", "1",
                     "--servers", "mini_engine,transformers", "--no-offline"),
         own_engines=True),
]


def by_name() -> dict[str, Step]:
    """Every step, by results name."""
    return {step.name: step for step in STEPS}


# The summary is no step of the list (lab.py runs it after them, once the lab's run is saved,
# and it has no row in its own table: number "-"): the report page shows it last, its RECORD and
# FIGURES read from its package (lessons/summary/) as a step's are.
SUMMARY = Step("summary.py", "-", "Summary of the lab")


def load_all(parts: list[Step] | None = None
             ) -> tuple[dict[str, results.Result], dict[str, str]]:
    """Every step's saved result (or every part's: the report page adds SUMMARY), typed, and
    the lab's last run; with, for each result this lab cannot read, its one line (run it
    again)."""
    res, stale = {}, {}
    loaders = {step.name: step.load for step in (STEPS if parts is None else parts)}
    loaders["lab_run"] = lambda: results.load("lab_run", results.LabRun, "make lab")
    for name, load in loaders.items():
        try:
            record = load()
        except results.StaleResult as e:
            stale[name] = str(e)
            continue
        if record is not None:
            res[name] = record
    return res, stale


# --- the section-10 table (the summary prints it, the report page shows it) -----------------
@dataclass
class SummaryRow(results.Record):
    step: str
    what: str
    source: str        # the source's own figure (its section 10), "-" where it has none
    figure: str        # this run's


def table_rows(res: dict[str, results.Result], stale: dict[str, str] | None = None
               ) -> list[SummaryRow]:
    """(step, what it showed, the source's figure, this run's) for every step, each built by
    its lesson's summary_row from its typed result; a step not run says how to run it, one
    this lab cannot read says to run it again."""
    stale = stale or {}
    rows = []
    for step in STEPS:
        if step.name in stale:
            figure = f"older result: run {step.label} again"
        elif step.name not in res:
            figure = f"not run yet: python {step.script}"
        else:
            figure = step.row(res[step.name])
        rows.append(SummaryRow(step.number, step.title, step.source or "-", figure))
    return rows
