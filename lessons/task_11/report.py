"""Task 11's report (task_11_chunked_prefill.py prints it, in this order): what ran, then the
three parts (correct, mini_engine measured, vLLM) and the KEY INSIGHT lines, each a whole sentence
chosen from the figures it states. What a learner does not need to follow the lesson (the p99
gaps, vLLM's /metrics histogram, the notes on how a figure is counted) is printed inside
report.detail(). Printing only: the script measures, these print its record
(lessons/task_11/record.py), read by attribute, every list of runs in the record's order, no
chunking first."""
from __future__ import annotations

from common import fmt, report
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
    low, high = w.min_long_prompt_tokens, w.max_long_prompt_tokens
    prompt_tokens = f"{low:,}" if low == high else f"{low:,}-{high:,}"
    report.run_info(model_choice, dtype, threads,
                    Engine=f"mini_engine{vllm}, batch cap {s.max_num_seqs}, "
                           f"{report.term('greedy')}")
    report.note(f"Settings: {report.term('chunked prefill')} off, each prompt's "
                f"{report.term('prefill')} in one step; then a {report.term('token budget')} of "
                f"{', '.join(map(str, s.budgets_tokens))} tokens a step.")
    docs = "long document" if s.num_long_docs == 1 else "long documents"
    report.note(f"Workload: {s.num_chats} chats streaming {s.chat_output_tokens} tokens each; "
                f"once each has made {s.arrive_after_tokens}, {s.num_long_docs} {docs} of "
                f"{prompt_tokens} prompt tokens make {s.long_output_tokens} each.")
    with report.detail():
        report.row("max_model_len", f"{s.max_model_len} (the budget without chunking)")
        report.row("KV cache", f"{s.kv_cache_bytes:,} B (the whole workload at once in fp32), "
                               f"blocks of {s.page_size_tokens}")
        report.row("mini_engine's kernels", s.kernels)
        report.row("Prompts", f"chats {w.min_chat_prompt_tokens}-{w.max_chat_prompt_tokens} "
                              f"tokens; documents \"{INSTRUCTION.strip()}\" + {s.long_tokens} "
                              f"tokens of {w.source}")
    if source_note:
        report.note(source_note)


def print_report(res: ChunkedPrefill) -> None:
    print_correct(res)
    print_engine(res)
    if res.vllm:
        print_vllm(res)
    report.detail_hint()
    report.insight(insights(res))


def print_correct(res: ChunkedPrefill) -> None:
    c, s = res.correct, res.settings
    report.section("1. CORRECT: each budget against no chunking (fp32)")
    report.row(f"Budget {', '.join(map(str, s.budgets_tokens))} vs off", ", ".join(
        f"{same}/{c.num_requests}" for same in c.num_identical) + " identical")
    report.row(f"Budget {min(s.budgets_tokens)} vs transformers",
               f"{c.num_identical_hf}/{c.num_checked_hf} identical")
    line = dtype_line(res)
    if line:
        report.note(line)


def dtype_line(res: ChunkedPrefill) -> str | None:
    """Part 2's requests in the run's dtype against no chunking, where some differ: fp32 decides
    whether that is the schedule (None: every one the same)."""
    c, n, same = res.correct, res.correct.num_requests, res.num_identical_in_dtype
    if min(same) == n:
        return None
    matched = f"{min(same)}" if min(same) == max(same) else f"{min(same)}-{max(same)}"
    if min(c.num_identical) == n:
        return (f"In {res.header.dtype}, {matched} of {n} requests matched no chunking; fp32 "
                f"matched every one, so the difference is rounding (a chunk's matmuls run in "
                f"other shapes), not the schedule.")
    return (f"In {res.header.dtype}, {matched} of {n} requests matched no chunking, and fp32 "
            f"differs too.")


def widths(num_runs: int) -> list[int]:
    return [LABEL_WIDTH] + [(report.WIDTH - LABEL_WIDTH) // num_runs] * num_runs


def headers(runs) -> list[str]:
    """'off' for no chunking, then each budget's tokens a step."""
    return ["Chunked prefill, budget", *("off" if r.label == NO_CHUNKING else
                                         r.label.removeprefix("budget ") for r in runs)]


def latency_rows(runs) -> list[tuple]:
    """The chats' gaps and the documents' TTFT of each run (EngineRun or ServerRun): the kept
    pass's, but the TTFT of a run of several passes is their median, as the insight says it
    (the kept pass is the median by the stall, not by the TTFT)."""
    def cells(fn):
        return [("-" if r.latency is None else fn(r.latency)) for r in runs]

    def ttft(r) -> str:
        return fmt.secs(compared(r, r, "mean_long_ttft_s")[0])
    return [("Chats: gap mean (ms)", *cells(lambda x: f"{1000 * x.mean_itl_s:,.0f}")),
            ("  longest stall (ms)", *cells(lambda x: f"{1000 * x.max_itl_s:,.0f}")),
            ("Long docs: TTFT mean (s)", *("-" if r.latency is None else ttft(r)
                                           for r in runs))]


def p99_row(latencies: list[Latency | None]) -> tuple:
    return ("Chats: gap p99 (ms)", *("-" if x is None else f"{1000 * x.p99_itl_s:,.0f}"
                                    for x in latencies))


def print_engine(res: ChunkedPrefill) -> None:
    runs = res.mini_engine
    report.section(f"2. MEASURED IN mini_engine ({res.header.dtype})")
    report.table(headers(runs), [
        *latency_rows(runs),
        ("Tokens/s", *(f"{r.tokens_per_s:.1f}" for r in runs)),
        ("Steps", *(r.num_steps for r in runs)),
        ("Most tokens in a step", *(f"{r.max_step_tokens:,}" for r in runs)),
        ("  the budget", *(f"{r.budget_tokens:,}" for r in runs))],
        widths(len(runs)))
    report.note(f"Gap: the {report.term('ITL')} of a chat. {report.term('TTFT')}: from the "
                f"long document's arrival.")
    passes_note(runs, "taking turns")
    with report.detail():
        n = res.correct.num_requests
        report.table(headers(runs), [
            p99_row([r.latency for r in runs]),
            ("Outputs as no chunking", "", *(f"{k}/{n}" for k in res.num_identical_in_dtype))],
            widths(len(runs)))


def print_vllm(res: ChunkedPrefill) -> None:
    runs, num_long_tokens = res.vllm, res.workload.num_long_prompt_tokens

    def per_step(r: ServerRun) -> str:
        return "-" if r.num_prefill_steps is None else \
            f"{num_long_tokens / r.num_prefill_steps:,.0f}"

    report.section("3. vLLM: THE SAME WORKLOAD THROUGH ITS SERVER")
    report.table(headers(runs), [
        *latency_rows(runs),
        ("Tokens/s", *(f"{r.level.tokens_per_s:.1f}" for r in runs)),
        ("Docs' prefill (steps)", *("-" if r.num_prefill_steps is None else r.num_prefill_steps
                                    for r in runs)),
        ("  prompt tokens a step", *(per_step(r) for r in runs)),
        ("Succeeded", *(f"{r.level.num_ok}/{r.level.num_users}" for r in runs))],
        widths(len(runs)))
    report.note("Gap: between two streamed chunks of one chat. Docs' prefill: as the chats' "
                "streams show it, a token a step.")
    passes_note(runs, "one after another")
    with report.detail():
        report.table(headers(runs), [
            p99_row([r.latency for r in runs]),
            ("Chats' tokens at arrival", *("-" if r.num_chat_tokens_at_arrival is None else
                                           r.num_chat_tokens_at_arrival for r in runs)),
            ("Steps (/metrics)", *("-" if r.steps is None else r.steps.num_steps for r in runs)),
            ("  counted over budget", *("-" if r.steps is None or r.budget_tokens is None else
                                        r.steps.steps_over(r.budget_tokens) for r in runs))],
            widths(len(runs)))
        report.note("Docs' prefill: the chats' tokens streamed between the documents' arrival "
                    "and their last first token (a token a step), less the one that ended the "
                    "step running when they came. Steps: the count of "
                    "vllm:iteration_tokens_total over the load; vLLM adds a prompt's tokens to "
                    "that histogram whole, in the step that makes its first token, so a prompt "
                    "computed in chunks counts as one step over the budget.")


def passes_note(runs, how: str) -> None:
    """Which columns are the median pass of several, of how many, and the spreads of their
    passes: the longest stall and the mean TTFT that the insight compares."""
    repeated = [r for r in runs if r.passes and r.passes.max_itl_s.num_passes > 1]
    if not repeated:
        return
    num = min(r.passes.max_itl_s.num_passes for r in repeated)
    report.note(f"{' and '.join(r.label for r in repeated)}: the median pass by the longest "
                f"stall, and the median TTFT, of {num} {how}; the others ran once.")
    with report.detail():
        for r in repeated:
            report.note(f"{r.label}: longest stall "
                        f"{r.passes.max_itl_s.scaled(1000).text(0, ' ms')}, TTFT "
                        f"{r.passes.mean_long_ttft_s.text(2, ' s')}", indent=2)


# --- the insight ---------------------------------------------------------------------------------
# Each sentence is one whole template, chosen from the figures it states; a change that the
# spreads of the passes overlap is "not told apart", and claims neither a cut nor a cost.
def stall_line(name: str, off, on, budget: int) -> str:
    """The stall a budget removed (or did not), from two runs (EngineRun or ServerRun): the
    medians of their passes where both ran several."""
    a, b, overlap = compared(off, on, "max_itl_s")
    said = f"{1000 * a:,.0f} -> {1000 * b:,.0f} ms"
    if overlap:
        return (f"{name}: at a budget of {budget} tokens a step, the chats' longest stall "
                f"({said}) was not told apart from no chunking.")
    if b < a:
        return (f"{name}: a budget of {budget} tokens a step cut the chats' longest stall "
                f"{said} ({fmt.times(a / b, 1)} shorter).")
    return (f"{name}: a budget of {budget} tokens a step did not shorten the chats' longest "
            f"stall ({said}).")


def ttft_line(off, on) -> str:
    """What the same budget cost the long documents' TTFT (or did not)."""
    a, b, overlap = compared(off, on, "mean_long_ttft_s")
    said = f"{fmt.secs(a)} -> {fmt.secs(b)} s"
    if overlap:
        return f"The long documents' TTFT was not told apart ({said})."
    if b > a:
        return f"It cost the long documents' TTFT {said} ({fmt.times(b / a)})."
    return f"It cost the long documents no TTFT ({said})."


def trade_line(name: str, off, on, budget: int) -> str:
    """Both sides of the trade, in one sentence where the passes told neither apart."""
    stall, ttft = (compared(off, on, what) for what in ("max_itl_s", "mean_long_ttft_s"))
    if stall[2] and ttft[2]:
        return (f"{name}: at a budget of {budget} tokens a step, neither the chats' longest stall"
                f" ({1000 * stall[0]:,.0f} -> {1000 * stall[1]:,.0f} ms) nor the documents' TTFT"
                f" ({fmt.secs(ttft[0])} -> {fmt.secs(ttft[1])} s) was told apart.")
    return f"{stall_line(name, off, on, budget)} {ttft_line(off, on)}"


def correct_line(res: ChunkedPrefill) -> str:
    """A bug or not: fp32 decides (the run's dtype is part 1's note)."""
    c, s = res.correct, res.settings
    n = c.num_requests
    bad = [f"{b} ({n - k} differ)" for b, k in zip(s.budgets_tokens, c.num_identical) if k < n]
    if bad:
        return f"In fp32, requests differ from no chunking at budget {', '.join(bad)}: a bug."
    return f"Chunking changed no token: in fp32, {n}/{n} requests were identical at every budget."


def budget_line(res: ChunkedPrefill) -> str:
    """Whether every chunked step of mini_engine held its budget."""
    off = res.mini_engine[0]
    over = [r.label for r in res.mini_engine if r.max_step_tokens > r.budget_tokens]
    if over:
        return f"Steps over their budget at {', '.join(over)}: a bug."
    return (f"Without chunking one step computed {off.max_step_tokens:,} tokens while the chats "
            f"waited; chunked, no step passed its budget.")


def vllm_lines(res: ChunkedPrefill) -> list[str]:
    """The same trade in vLLM, and the budget holding as its streams show it."""
    vllm = [r for r in res.vllm or [] if r.latency is not None and r.budget_tokens]
    off = next((r for r in vllm if not r.is_chunked), None)
    on = min((r for r in vllm if r.is_chunked), default=None, key=lambda r: r.budget_tokens)
    if not (off and on):
        return []
    lines = [trade_line("vLLM", off, on, on.budget_tokens)]
    if off.num_prefill_steps and on.num_prefill_steps:
        per_step = res.workload.num_long_prompt_tokens / on.num_prefill_steps
        if per_step <= on.budget_tokens:
            lines.append(f"vLLM's streams show {on.num_prefill_steps} steps of prefill at "
                         f"budget {on.budget_tokens} ({off.num_prefill_steps} without chunking):"
                         f" {per_step:,.0f} prompt tokens a step, within the budget.")
        else:
            lines.append(f"vLLM's streams show {on.num_prefill_steps} steps of prefill at "
                         f"budget {on.budget_tokens} ({off.num_prefill_steps} without chunking):"
                         f" {per_step:,.0f} prompt tokens a step, over the budget (the streams "
                         f"merged tokens, or the budget did not hold).")
    return lines


def insights(res: ChunkedPrefill) -> list[str]:
    """At most five lines: correct, mini_engine's trade, the budget held, vLLM's trade and its
    steps."""
    off, small = res.mini_engine[0], res.smallest
    return [correct_line(res),
            trade_line("mini_engine", off, small, small.budget_tokens),
            budget_line(res)] + vllm_lines(res)
