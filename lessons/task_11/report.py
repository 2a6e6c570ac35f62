"""Task 11's report (task_11_chunked_prefill.py prints it, in this order): what ran, then the
three parts (correct, mini_engine measured, vLLM) and the KEY INSIGHT lines, each chosen from the
figures it states. Printing only: the script measures, these print its record
(lessons/task_11/record.py), read by attribute, every list of runs in the record's order, no
chunking first."""
from __future__ import annotations

from common import report
from lessons.task_11.record import (NO_CHUNKING, ChunkedPrefill, Latency, ServerRun, Settings,
                                    compared)
from lessons.task_11.workloads import INSTRUCTION

LABEL_WIDTH = 25   # the tables' first column; the settings share the other 40


def print_run_info(model_choice, dtype, threads: int, s: Settings, w, source_note: str | None
                   ) -> None:
    report.title("Task 11: One Long Prompt Stalls Everyone - Chunked Prefill")
    vllm = ("" if not s.is_vllm_measured else
            f" (--base-url {s.base_url} for vLLM, at its own setting)" if s.base_url else
            " and vLLM's server")
    report.run_info(model_choice, dtype, threads,
                    Engine=f"mini_engine{vllm}, max_model_len={s.max_model_len}, KV "
                           f"{s.kv_cache_bytes:,} B (the whole workload at once in fp32), pages "
                           f"of {s.page_size_tokens}, batch cap {s.max_num_seqs}, greedy, "
                           f"mini_engine's kernels {s.kernels}",
                    Settings=f"no chunking (a prompt whole in one step, budget "
                             f"{s.max_model_len}), then budgets of "
                             f"{', '.join(map(str, s.budgets_tokens))} tokens a step",
                    Workload=f"{s.num_chats} chats ({w.min_chat_prompt_tokens}-"
                             f"{w.max_chat_prompt_tokens} prompt tokens) streaming "
                             f"{s.chat_output_tokens} tokens each; once each has made "
                             f"{s.arrive_after_tokens}, {s.num_long_docs} long documents "
                             f"(\"{INSTRUCTION.strip()}\" + {s.long_tokens} tokens of {w.source}: "
                             f"{w.min_long_prompt_tokens}-{w.max_long_prompt_tokens} prompt "
                             f"tokens) make {s.long_output_tokens} each")
    if source_note:
        report.note(source_note)


def print_report(res: ChunkedPrefill) -> None:
    print_correct(res)
    print_engine(res)
    if res.vllm:
        print_vllm(res)
    report.insight(insights(res))


def print_correct(res: ChunkedPrefill) -> None:
    c, s = res.correct, res.settings
    report.section("1. CORRECT: chunking changes no token (fp32, greedy)")
    for budget, same in zip(s.budgets_tokens, c.num_identical):
        report.row(f"Budget {budget} vs no chunking", f"{same}/{c.num_requests} requests "
                                                      "identical, every token")
    report.row("Against transformers", f"{c.num_identical_hf}/{c.num_checked_hf} identical (a "
                                       f"chat and a long document, budget "
                                       f"{min(s.budgets_tokens)})")


def widths(num_runs: int) -> list[int]:
    return [LABEL_WIDTH] + [(report.WIDTH - LABEL_WIDTH) // num_runs] * num_runs


def headers(runs) -> list[str]:
    """'off' for no chunking, then each budget's tokens a step."""
    return ["Chunked prefill, budget", *("off" if r.label == NO_CHUNKING else
                                         r.label.removeprefix("budget ") for r in runs)]


def latency_rows(latencies: list[Latency | None]) -> list[tuple]:
    def cells(fn):
        return [("-" if x is None else fn(x)) for x in latencies]
    return [("Chats: gap mean (ms)", *cells(lambda x: f"{1000 * x.mean_itl_s:,.0f}")),
            ("  p99 (ms)", *cells(lambda x: f"{1000 * x.p99_itl_s:,.0f}")),
            ("  longest stall (ms)", *cells(lambda x: f"{1000 * x.max_itl_s:,.0f}")),
            ("Long docs: TTFT mean (s)", *cells(lambda x: f"{x.mean_long_ttft_s:.2f}"))]


def print_engine(res: ChunkedPrefill) -> None:
    runs, n = res.mini_engine, res.correct.num_requests
    report.section(f"2. MEASURED IN mini_engine ({res.header.dtype})")
    report.table(headers(runs), [
        *latency_rows([r.latency for r in runs]),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
        ("Steps", *(r.num_steps for r in runs)),
        ("Most tokens in a step", *(f"{r.max_step_tokens:,}" for r in runs)),
        ("  the budget", *(f"{r.budget_tokens:,}" for r in runs)),
        ("Outputs as no chunking", "", *(f"{k}/{n}" for k in res.num_identical_in_dtype))],
        widths(len(runs)))
    report.note("Gap: between two tokens of one chat (inter-token latency); TTFT: from the "
                "long document's arrival")
    passes_note(runs, "taking turns")


def print_vllm(res: ChunkedPrefill) -> None:
    runs, num_long_tokens = res.vllm, res.workload.num_long_prompt_tokens

    def per_step(r: ServerRun) -> str:
        return "-" if r.num_prefill_steps is None else \
            f"{num_long_tokens / r.num_prefill_steps:,.0f}"

    report.section("3. vLLM: THE SAME WORKLOAD THROUGH ITS SERVER")
    report.table(headers(runs), [
        *latency_rows([r.latency for r in runs]),
        ("Tokens/s", *(f"{r.level.tokens_per_s:.1f}" for r in runs)),
        ("Chats' tokens at arrival", *("-" if r.num_chat_tokens_at_arrival is None else
                                       r.num_chat_tokens_at_arrival for r in runs)),
        ("Docs' prefill (steps)", *("-" if r.num_prefill_steps is None else r.num_prefill_steps
                                    for r in runs)),
        ("  prompt tokens a step", *(per_step(r) for r in runs)),
        ("Steps (/metrics)", *("-" if r.steps is None else r.steps.num_steps for r in runs)),
        ("  counted over budget", *("-" if r.steps is None or r.budget_tokens is None else
                                r.steps.steps_over(r.budget_tokens) for r in runs)),
        ("Succeeded", *(f"{r.level.num_ok}/{r.level.num_users}" for r in runs))],
        widths(len(runs)))
    report.note("Gap: between two streamed chunks of one chat. Docs' prefill: the chats' tokens "
                "streamed between the documents' arrival and their last first token (a token a "
                "step), less the one that ended the step running when they came. Steps: the "
                "count of vllm:iteration_tokens_total over the load; vLLM adds a prompt's tokens "
                "to that histogram whole, in the step that makes its first token, so a prompt "
                "computed in chunks counts as one step over the budget")
    passes_note(runs, "one after another on its server")


def passes_note(runs, how: str) -> None:
    """Which columns are the median pass of several, and of how many."""
    repeated = [r for r in runs if r.passes and r.passes.max_itl_s.num_passes > 1]
    if repeated:
        report.note(f"{' and '.join(r.label for r in repeated)}: the median pass by the longest "
                    f"stall, of {min(r.passes.max_itl_s.num_passes for r in repeated)} {how}; "
                    f"the other columns ran once")


def spreads(off, on, what: str, scale: float, fmt: str, unit: str) -> str:
    """'; 3 passes each: 1,100-1,250 and 150-170 ms' where both settings ran several, else ''."""
    if compared(off, on, what)[2] is None:
        return ""
    a, b = (getattr(r.passes, what).scaled(scale) for r in (off, on))
    return (f"; {min(a.num_passes, b.num_passes)} passes each: {a.low:{fmt}}-{a.high:{fmt}} and "
            f"{b.low:{fmt}}-{b.high:{fmt}}{unit}")


def trade(name: str, off, on, budget: int) -> str:
    """The stall removed and the TTFT paid (or not), each by how much: two runs (EngineRun or
    ServerRun), the medians of their passes where both ran several, and a change their spreads
    cannot tell apart said so."""
    a, b, overlap = compared(off, on, "max_itl_s")
    said, passes = f"{1000 * a:,.0f} -> {1000 * b:,.0f} ms", spreads(off, on, "max_itl_s", 1000,
                                                                    ",.0f", " ms")
    stall = (f"left the chats' longest stall where the spreads cannot tell it apart ({said}"
             f"{passes})" if overlap else
             f"cut the chats' longest stall {said} ({a / b:.1f}x shorter{passes})" if b < a else
             f"did not shorten the chats' longest stall ({said}{passes})")
    a, b, overlap = compared(off, on, "mean_long_ttft_s")
    said, passes = f"{a:.2f} -> {b:.2f} s", spreads(off, on, "mean_long_ttft_s", 1, ".2f", " s")
    ttft = (f"the long documents' TTFT cannot be told apart ({said}{passes})" if overlap else
            f"cost the long documents' TTFT {said} ({b / a:.2f}x{passes})" if b > a else
            f"cost the long documents no TTFT ({said}{passes})")
    return f"{name}: a budget of {budget} tokens a step {stall}, and {ttft}"


def correct_line(res: ChunkedPrefill) -> str:
    """A bug or rounding: fp32 decides; the run's dtype in the same line, so the result is said
    once."""
    c, s = res.correct, res.settings
    n = c.num_requests
    bad = [f"{b} ({n - k} differ)" for b, k in zip(s.budgets_tokens, c.num_identical) if k < n]
    if bad:
        return f"In fp32, requests differ from no chunking at budget {', '.join(bad)}: a bug"
    line = f"Chunking changed no token: {n}/{n} requests identical in fp32 at every budget"
    same = res.num_identical_in_dtype
    if min(same) < n:
        matched = f"{min(same)}" if min(same) == max(same) else f"{min(same)}-{max(same)}"
        line += (f"; in {res.header.dtype}, {matched} of {n} matched no chunking, so the "
                 f"difference is rounding (a chunk's matmuls and attention run in other shapes, "
                 f"which round differently in {res.header.dtype}), not the schedule")
    return line


def vllm_lines(res: ChunkedPrefill) -> list[str]:
    """The same trade in vLLM, and the budget holding as its streams show it."""
    vllm = [r for r in res.vllm or [] if r.latency is not None and r.budget_tokens]
    off = next((r for r in vllm if not r.is_chunked), None)
    on = min((r for r in vllm if r.is_chunked), default=None, key=lambda r: r.budget_tokens)
    if not (off and on):
        return []
    lines = [trade("vLLM", off, on, on.budget_tokens)]
    if off.num_prefill_steps and on.num_prefill_steps:
        per_step = res.workload.num_long_prompt_tokens / on.num_prefill_steps
        lines.append(f"vLLM's long documents took {on.num_prefill_steps} steps to prefill at "
                     f"budget {on.budget_tokens} ({off.num_prefill_steps} without chunking), "
                     f"the chats' streams show: about {per_step:,.0f} prompt tokens a step, "
                     + ("within the budget" if per_step <= on.budget_tokens else
                        "over the budget (the streams merged tokens, or the budget did not "
                        "hold)"))
    return lines


def insights(res: ChunkedPrefill) -> list[str]:
    """At most five lines: correct, mini_engine's trade, the budget held, vLLM's trade and its
    steps."""
    runs = res.mini_engine
    lines = [correct_line(res)]
    off, small = runs[0], res.smallest
    lines.append(trade("mini_engine", off, small, small.budget_tokens))
    over = [r.label for r in runs if r.max_step_tokens > r.budget_tokens]
    lines.append(f"Without chunking one step computed {off.max_step_tokens:,} tokens while the "
                 f"chats waited; chunked, no step computed more than its budget"
                 if not over else f"Steps over their budget at {', '.join(over)}: a bug")
    return lines + vllm_lines(res)
