"""The one list of the lab's steps. Whatever goes over the lab's steps reads it: `make lab`
(lab.py) runs them in this order with their arguments, the summary (summary.py) builds its
section-10 table from their rows, the figures (common/figures.py) are drawn from their entries,
results/report.html (common/html_report.py) shows them in this order, and the tests check that
every task_*.py is here and named in the README.

Adding a task is one script plus one entry here: its script, its number and title in the
summary, its arguments in `make lab` and in `python lab.py --quick`, the record its result is
read back into (common.results) with the summary's row built from it, and its figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from common import figures
from common import results as r

PORT = "{port}"   # in args: replaced by the lab server's port


@dataclass(frozen=True)
class Step:
    script: str                                   # the file `make lab` runs
    number: str                                   # its number in the summary's table
    title: str                                    # what it shows, in the summary's table
    result: type[r.Result] | None = None          # its saved result, read back typed
    row: Callable[[object], str] | None = None    # the summary's figure, from that result
    args: tuple[str, ...] = ()                    # its arguments in `make lab`
    quick_args: tuple[str, ...] = ()              # added by --quick (a later flag wins)
    figures: tuple[tuple[str, Callable], ...] = ()   # (file suffix, draw(res) -> Figure)
    own_engines: bool = False                     # runs engines of its own: the server stops

    @property
    def name(self) -> str:
        """Its results' name: results/<name>.json, .txt, .png."""
        return Path(self.script).stem

    @property
    def label(self) -> str:
        """'task 6', or 'python verify_environment.py': what a learner runs again."""
        return f"task {self.number}" if self.name.startswith("task_") else f"python {self.script}"

    def command(self, port: int, quick: bool = False) -> list[str]:
        args = [str(port) if a == PORT else a for a in self.args]
        return [self.script, *args, *(self.quick_args if quick else ())]


# --- the summary's rows, each from its step's typed result ---------------------------------------
def _tuning(t: r.Tuning) -> str:
    return " / ".join(f"{c.label[0]} {c.throughput_tok_s:.1f}" for c in t.configs) + " tok/s"


def _dashboard(d: r.Dashboard) -> str:
    """What task 8's snapshot showed: the batch, what waited, the KV cache."""
    s = d.snapshot
    sent = f"{d.load.sent} sent: " if d.load else ""
    kv = "" if s.kv_usage is None else f", KV {100 * s.kv_usage:.0f}%"
    rate = f", {d.last_interval.tokens_per_s:.1f} tok/s" if d.last_interval else ""
    return f"{sent}{s.running:.0f} running, {s.waiting:.0f} waiting{rate}{kv}"


def _own_engine(e: r.OwnEngine) -> str:
    """Task 9: continuous vs static on the same engine, engine vs vLLM."""
    parts = [f"{e.correctness.num_identical}/{e.correctness.num_prompts} = HF"]
    if e.continuous_over_static is not None:
        parts.append(f"{e.continuous_over_static:.2f}x static")
    if e.engine_over_vllm is not None:
        parts.append(f"{e.engine_over_vllm:.2f}x vLLM")
    return ", ".join(parts)


def _prefix(p: r.PrefixCaching) -> str:
    """Task 10: the engine's hit rate and TTFT with the cache, vLLM's hit rate."""
    vllm = "" if p.vllm_hit_rate is None else f", vLLM hit {100 * p.vllm_hit_rate:.0f}%"
    return (f"hit {100 * p.hit_rate:.0f}%, TTFT {p.ttft_off_s:.2f} -> {p.ttft_on_s:.2f} s"
            f"{vllm}")


def _peak(m: r.MultiUserLoad) -> str:
    measured = [lv for lv in m.levels if lv.throughput_tok_s]
    if not measured:
        return "no level made a token"
    top = max(measured, key=lambda lv: lv.throughput_tok_s)
    return f"{top.users} users {top.throughput_tok_s:.1f} tok/s ({m.scaling_factor:.1f}x)"


STEPS: list[Step] = [
    Step("verify_environment.py", "0", "Environment check", r.EnvironmentCheck,
         lambda v: f"{v.passed}/{v.total} passed"),
    Step("task_1_hf_baseline.py", "1", "HuggingFace baseline", r.HFBaseline,
         lambda t: f"{t.tokens_per_s:.1f} tok/s", quick_args=("--max-tokens", "10")),
    Step("task_2_vllm_inference.py", "2", "vLLM, one request", r.VLLMInference,
         lambda t: f"{t.tokens_per_s:.1f} tok/s"
                   + (f" ({t.speedup:.1f}x)" if t.speedup is not None else ""),
         quick_args=("--max-tokens", "10")),
    Step("task_3_kv_cache_problem.py", "3", "Contiguous KV allocation", r.ContiguousKV,
         lambda t: f"utilisation {t.utilization_pct}%",
         figures=(("", figures.reservations),)),
    Step("task_4_paged_attention.py", "4", "PagedAttention", r.PagedKV,
         lambda t: f"utilisation {t.paged.utilization_pct}%, users {t.users_ratio}x",
         figures=(("", figures.pages),)),
    Step("task_5_api_server.py", "5", "OpenAI-compatible server", r.ApiServer,
         lambda t: f"/v1/completions, {t.raw_http.latency_s:.2f} s",
         args=("--port", PORT), quick_args=("--max-tokens", "10")),
    Step("task_6_multi_user_load.py", "6", "Concurrent users", r.MultiUserLoad, _peak,
         args=("--port", PORT),
         quick_args=("--users", "1,20", "--max-tokens", "10", "--no-sequential"),
         figures=(("", figures.load_levels),)),
    Step("task_7_tuning.py", "7", "Parameter tuning", r.Tuning, _tuning,
         args=("--port", PORT), quick_args=("--max-tokens", "10"),
         figures=(("", figures.tuning),)),
    # the snapshot while 20 requests run, so it shows a batch, not an idle server; 20 tokens
    # each keep 8 running for a few seconds (task 7 leaves max_num_seqs=8)
    Step("task_8_dashboard.py", "8", "Dashboard over /metrics", r.Dashboard, _dashboard,
         args=("--once", "--load", "20", "--max-tokens", "20", "--server-port", PORT)),
    # task 9 runs its own engines (its own, transformers', vLLM's in-process): the lab's server
    # that tasks 5-8 shared is stopped before it, so its ~2.2 GB is not charged to task 9
    Step("task_9_build_your_own_engine.py", "9", "Engine built from scratch", r.OwnEngine,
         _own_engine, quick_args=("--requests", "8", "--mean-output", "8"),
         figures=(("", figures.batching_timeline), ("phases", figures.step_phases)),
         own_engines=True),
    # task 10 starts the lab's server itself, prefix caching on then off, and stops it after
    Step("task_10_prefix_caching.py", "10", "Prefix caching", r.PrefixCaching, _prefix,
         args=("--port", PORT), quick_args=("--requests", "8", "--output", "4"),
         figures=(("", figures.shared_pages),), own_engines=True),
]

# Not a step `make lab` runs as a script (lab.py calls it at the end), but a section of the
# report page with a figure of its own.
SUMMARY = Step("summary.py", "", "Summary", r.Summary, figures=(("", figures.roofline),))


def by_name() -> dict[str, Step]:
    """Every step and the summary, by results name."""
    return {step.name: step for step in [*STEPS, SUMMARY]}


def report_names() -> list[str]:
    """The sections of results/report.html, in order: every step, then the summary."""
    return [step.name for step in STEPS] + [SUMMARY.name]


def figures_of(name: str) -> tuple[tuple[str, Callable], ...]:
    step = by_name().get(name)
    return step.figures if step else ()
