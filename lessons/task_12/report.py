"""Task 12's report (task_12_speculative_decoding.py prints it, in this order): what ran, then the
three parts (correct, mini_engine measured, vLLM) and the KEY INSIGHT lines, each chosen from the
figures it states. Printing only: the script measures, these print its record
(lessons/task_12/record.py), read by attribute."""
from __future__ import annotations

from common import report
from lessons.task_12.record import (WORKLOADS, EngineRun, ServerRun, SpeculativeDecoding,
                                    times_text)
from lessons.task_12.workloads import INSTRUCTION

LABEL_WIDTH = 25        # the tables' first column; the runs share the other 40
SOURCE_SPEEDUP = "1.1x"  # the source's vLLM over HuggingFace, one request (its section 10)
ABOUT_THE_SAME = 1.25   # a step with guesses at most this much dearer "cost about the same"


def print_run_info(model_choice, dtype, threads: int, s, w, source_note: str | None) -> None:
    report.title("Task 12: Guess, Then Check - Speculative Decoding")
    vllm = ("" if not s.is_vllm_measured else
            f" (--base-url {s.base_url} for vLLM, at its own setting)" if s.base_url else
            " and vLLM's server (prefix caching off)")
    report.run_info(model_choice, dtype, threads,
                    Engine=f"mini_engine{vllm}, max_model_len={s.max_model_len}, KV "
                           f"{s.kv_cache_bytes:,} B (a workload at once in fp32), pages of "
                           f"{s.page_size_tokens}, batch cap {s.num_requests}, greedy, "
                           f"mini_engine's kernels {s.kernels}",
                    Speculation=f"n-gram prompt lookup (vLLM's ngram): the last n tokens, n from"
                                f" {s.prompt_lookup_max} down to {s.prompt_lookup_min}, found "
                                f"earlier in the request; k = "
                                f"{', '.join(map(str, s.ks))} guesses a step in mini_engine, "
                                f"k = {s.vllm_k} in vLLM",
                    Workloads=f"copy (\"{INSTRUCTION.strip()}\" + {s.copy_window_tokens} tokens "
                              f"of {w.source}: {w.min_copy_prompt_tokens}-"
                              f"{w.max_copy_prompt_tokens} prompt tokens) and chat (the lab's "
                              f"questions: {w.min_chat_prompt_tokens}-"
                              f"{w.max_chat_prompt_tokens}); {s.output_tokens} tokens an answer,"
                              f" EOS held off; {s.num_sequential} requests one at a time, then "
                              f"{s.num_requests} at once")
    if source_note:
        report.note(source_note)


def level(s, is_concurrent: bool) -> str:
    """'16 at once', or 'one at a time' (s.num_sequential requests, each alone)."""
    return f"{s.num_requests} at once" if is_concurrent else "one at a time"


def print_report(res: SpeculativeDecoding) -> None:
    print_correct(res)
    print_engine(res)
    if res.vllm:
        print_vllm(res)
    report.insight(insights(res))


def print_correct(res: SpeculativeDecoding) -> None:
    report.section("1. CORRECT: speculation changes no token (fp32, greedy)")
    report.note(f"{res.settings.num_requests} requests of each workload at once, at the largest "
                "k: the most guesses verified and rolled back")
    for c in res.correct:
        report.row(f"{c.workload.capitalize()}, k = {c.k} vs off",
                   f"{c.num_identical}/{c.num_requests} requests identical, "
                   f"{c.num_tokens_identical:,}/{c.num_tokens:,} tokens ({c.num_accepted_tokens:,}"
                   f" of {c.num_draft_tokens:,} guesses kept)")


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def range_text(spread) -> str:
    """'2.41-2.58': a speed-up's lowest and highest pass."""
    return "-" if spread is None else f"{spread.low:.2f}-{spread.high:.2f}"


def widths(num_runs: int) -> list[int]:
    return [LABEL_WIDTH] + [(report.WIDTH - LABEL_WIDTH) // num_runs] * num_runs


def print_engine(res: SpeculativeDecoding) -> None:
    s = res.settings
    report.section(f"2. MEASURED IN mini_engine ({res.header.dtype})")
    rows = []
    for name in WORKLOADS:
        for is_concurrent in (False, True):
            runs: list[EngineRun] = [res.engine_run(name, is_concurrent, k) for k in [0, *s.ks]]
            rows += [(f"{name.capitalize()}, {level(s, is_concurrent)}",),
                     ("  tokens/s", *(f"{r.tokens_per_s:,.1f}" for r in runs)),
                     ("  ms per output token", *(f"{1000 * r.mean_tpot_s:,.1f}" for r in runs)),
                     ("  speed-up", *(times(res.engine_speedup(name, is_concurrent, r.k))
                                      for r in runs)),
                     *([("  its range", "", *(range_text(res.engine_speedup_spread(
                         name, is_concurrent, r.k)) for r in runs[1:]))]
                       if s.num_passes > 1 else []),
                     ("  guesses accepted", *(pct(r.accepted_share) for r in runs)),
                     ("  tokens a step", *(f"{r.tokens_per_step:.2f}" for r in runs)),
                     ("  steps", *(f"{r.num_steps:,}" for r in runs)),
                     ("  step (ms)", *(f"{1000 * r.mean_step_s:,.1f}" for r in runs)),
                     ("  tokens as off", "", *(f"{r.num_identical}/{r.num_requests}"
                                               for r in runs[1:]))]
    report.table(["Speculation", "off", *(f"k={k}" for k in s.ks)], rows, widths(1 + len(s.ks)))
    passes = (f"Off and each k took turns, {s.num_passes} rounds after an untimed one: each "
              "figure is the median round's, the speed-up the median of the rounds' (its range: "
              "the lowest and highest round). " if s.num_passes > 1 else "One pass. ")
    report.note(passes + "ms per output token: after a request's first, its mean (vLLM's TPOT)."
                " Tokens a step: a decoding request's, 1 to k + 1. Step: the run's time over its "
                "steps. Tokens as off: requests whose every token is speculation off's")


def server_cells(res: SpeculativeDecoding, fn) -> list[str]:
    """fn(off, on) per workload and level (a request failed: '-')."""
    return [fn(*res.server_runs(name, is_concurrent)) if all(res.server_runs(name, is_concurrent))
            else "-" for name in WORKLOADS for is_concurrent in (False, True)]


def print_vllm(res: SpeculativeDecoding) -> None:
    s = res.settings
    headers = ["vLLM", *(f"{name}, {s.num_requests if c else s.num_sequential}"
                         for name in WORKLOADS for c in (False, True))]
    report.section("3. vLLM: THE SAME WORKLOADS THROUGH ITS SERVER")
    if s.base_url:
        return print_external(res, headers)

    def ok(off: ServerRun, on: ServerRun) -> str:
        return f"{off.level.num_ok + on.level.num_ok}/{off.level.num_users + on.level.num_users}"

    report.table(headers, [
        ("Tokens/s, off", *server_cells(res, lambda a, b: f"{a.level.tokens_per_s:,.1f}")),
        (f"  on (k = {s.vllm_k})", *server_cells(res, lambda a, b: f"{b.level.tokens_per_s:,.1f}")),
        ("  speed-up", *server_cells(res, lambda a, b: times(b.level.tokens_per_s /
                                                                 a.level.tokens_per_s))),
        *([("  its range", *(range_text(res.vllm_speedup_spread(name, c)) if all(
            res.server_runs(name, c)) else "-" for name in WORKLOADS for c in (False, True)))]
          if s.num_passes > 1 else []),
        ("ms per output token, off", *server_cells(res, lambda a, b: tpot(a))),
        ("  on", *server_cells(res, lambda a, b: tpot(b))),
        ("Guesses accepted", *server_cells(res, lambda a, b: pct(b.accepted_share))),
        ("Tokens a step", *server_cells(res, lambda a, b: "-" if b.tokens_per_step is None
                                         else f"{b.tokens_per_step:.2f}")),
        ("Same greedy text as off", *server_cells(res, lambda a, b: f"{b.num_same_text}/"
                                                                    f"{b.level.num_users}")),
        ("Succeeded, off and on", *(ok(a, b) for a, b in all_server_pairs(res)))],
        widths(4))
    passes = (f"{s.num_passes} passes of each level in each server, the median's figures; "
              "the servers ran one after the other, not in turns, so the speed-up's range is on's"
              " slowest pass over off's fastest to on's fastest over off's slowest. "
              if s.num_passes > 1 else "")
    report.note(passes + f"{s.num_sequential}: one request after another; {s.num_requests}: at "
                "once. Accepted: /metrics' vllm:spec_decode_num_accepted_tokens over "
                "num_draft_tokens. Tokens a step: as mini_engine's, the decoded tokens (all but "
                "each answer's first) over the steps that made them, decoded - accepted")


def all_server_pairs(res: SpeculativeDecoding) -> list[tuple[ServerRun, ServerRun]]:
    """Off and on per workload and level, failed requests included (for the count)."""
    def runs(name, c, on):
        return next(r for r in res.vllm if (r.workload, r.is_concurrent, bool(r.k)) ==
                    (name, c, on))
    return [(runs(name, c, False), runs(name, c, True)) for name in WORKLOADS
            for c in (False, True)]


def tpot(run: ServerRun) -> str:
    return "-" if run.level.mean_tpot_s is None else f"{1000 * run.level.mean_tpot_s:,.1f}"


def print_external(res: SpeculativeDecoding, headers: list[str]) -> None:
    """A --base-url server at its own setting: what it measured, nothing compared."""
    runs = res.vllm
    report.table(headers, [
        ("Tokens/s (its own)", *(f"{r.level.tokens_per_s:,.1f}" for r in runs)),
        ("ms per output token", *(tpot(r) for r in runs)),
        ("Guesses accepted", *(pct(r.accepted_share) for r in runs)),
        ("Succeeded", *(f"{r.level.num_ok}/{r.level.num_users}" for r in runs))], widths(4))


# --- the insight ---------------------------------------------------------------------------------
def correct_line(res: SpeculativeDecoding) -> str:
    """A bug or not: fp32 greedy decides; and what it says of part 2's requests in the run's
    dtype (mini_engine's only: vLLM never ran in fp32)."""
    bad = [f"{c.workload} k = {c.k} ({c.num_requests - c.num_identical} differ)"
           for c in res.correct if c.num_identical < c.num_requests]
    if bad:
        return f"In fp32, requests differ from speculation off at {', '.join(bad)}: a bug"
    n, k = res.correct[0].num_requests, res.correct[0].k
    kept = sum(c.num_accepted_tokens for c in res.correct)
    line = (f"Speculation changed no token: {n}/{n} requests of both workloads identical in fp32"
            f" at k = {k}, {kept:,} of their tokens accepted guesses")
    changed = [r for r in res.mini_engine if r.num_identical is not None and
               r.num_identical < r.num_requests]
    if changed:
        num = sum(r.num_requests - r.num_identical for r in changed)
        total = sum(r.num_requests for r in res.mini_engine if r.k)
        line += (f". In {res.header.dtype}, {num} of part 2's {total} requests with speculation "
                 "on differ from off: fp32 matched every one, so in mini_engine that is "
                 "rounding, not the method")
    return line


def step_cost(off: EngineRun, on: EngineRun) -> str:
    """What a step cost with the guesses against without, and against the tokens it made: the
    bet of speculation, measured."""
    x, gained = on.mean_step_s / off.mean_step_s, on.tokens_per_step
    line = (f"a step with its guesses took {1000 * on.mean_step_s:,.0f} ms against "
            f"{1000 * off.mean_step_s:,.0f} without ({x:.1f}x) and made {gained:.1f} tokens")
    if x >= gained:
        return line + ": dearer by as much as the tokens it made, or more"
    if x <= ABOUT_THE_SAME:
        return line + ": the guesses came nearly free, which is what speculation spends"
    return line + ": dearer, but by less than the tokens it made"


def unexplained(res: SpeculativeDecoding, name: str, is_concurrent: bool) -> str:
    """' (more than its 1.02 tokens a step account for: ...)' where vLLM's speed-up passes what
    its guesses bought by over 5 %, else nothing: the rest came from something this task did not
    measure (its two servers differ in more than the guesses)."""
    on = res.server_runs(name, is_concurrent)[1]
    x = res.vllm_speedup(name, is_concurrent)
    if x is None or on.tokens_per_step is None or x <= 1.05 * on.tokens_per_step:
        return ""
    return (f" (more than its {on.tokens_per_step:.2f} tokens a step account for; what else made "
            "it faster was not measured)")


def vllm_ratio(res: SpeculativeDecoding, name: str, is_concurrent: bool, sep: str = ", "
               ) -> str:
    """sep + "vLLM's ngram 2.14x (2.01-2.30)", or nothing without vLLM's figure."""
    spread = res.vllm_speedup_spread(name, is_concurrent)
    if spread is None:
        return ""
    return f"{sep}vLLM's ngram {times_text(spread)}{unexplained(res, name, is_concurrent)}"


def pays_line(res: SpeculativeDecoding) -> str:
    """One copy request at a time: the best k of mini_engine, what its step cost, and both
    engines at vLLM's k."""
    s = res.settings
    best = max(s.ks, key=lambda k: res.engine_speedup("copy", False, k))
    off, on = res.engine_run("copy", False, 0), res.engine_run("copy", False, best)
    line = (f"One copy request at a time (the source's one request got {SOURCE_SPEEDUP} from "
            f"vLLM): tokens/s {times_text(res.engine_speedup_spread('copy', False, best))} in "
            f"mini_engine at k = {best}, {pct(on.accepted_share)} of the guesses accepted; "
            f"{step_cost(off, on)}")
    at_vllm_k = ([f"mini_engine {times_text(res.engine_speedup_spread('copy', False, s.vllm_k))}"]
                 if best != s.vllm_k else []) + ([vllm_ratio(res, "copy", False, "")]
                                                 if res.vllm_speedup("copy", False) else [])
    return line + (f". At k = {s.vllm_k}: {', '.join(at_vllm_k)}" if at_vllm_k else "")


def many_line(res: SpeculativeDecoding) -> str:
    """--requests copies at once, at vLLM's k: what a request gained, and why the run gained
    less: its steps fell less than a request's tokens a step rose (the run lasts as long as its
    slowest request), and what a step of many rows and their guesses cost."""
    k, n = res.settings.vllm_k, res.settings.num_requests
    off, on = res.engine_run("copy", True, 0), res.engine_run("copy", True, k)
    line = (f"{n} copies at once: {times_text(res.engine_speedup_spread('copy', True, k))} in "
            f"mini_engine at k = {k}{vllm_ratio(res, 'copy', True)}. A request gained "
            f"{on.tokens_per_step:.1f} tokens a step ({pct(on.accepted_share)} accepted), and "
            f"the run took {off.num_steps} -> {on.num_steps} steps")
    if on.num_steps * on.tokens_per_step > 1.33 * off.num_steps:
        line += " (it lasts as long as its slowest request)"
    return line + f"; {step_cost(off, on)}"


def chat_line(res: SpeculativeDecoding) -> str:
    """The chat workload at vLLM's k, both levels."""
    k, n = res.settings.vllm_k, res.settings.num_requests
    alone, many = res.engine_run("chat", False, k), res.engine_run("chat", True, k)
    off_many = res.engine_run("chat", True, 0)
    return (f"Chat, where the answer is not in the prompt: {pct(alone.accepted_share)} of the "
            f"guesses accepted at k = {k}, {alone.tokens_per_step:.2f} tokens a step; one at a "
            f"time {times_text(res.engine_speedup_spread('chat', False, k))} in mini_engine"
            f"{vllm_ratio(res, 'chat', False)}; {n} at once "
            f"{times_text(res.engine_speedup_spread('chat', True, k))}"
            f"{vllm_ratio(res, 'chat', True)}; there {step_cost(off_many, many)}")


def vllm_text_line(res: SpeculativeDecoding) -> list[str]:
    """Whether vLLM's greedy text changed with speculation on. Why it changed is not said:
    vLLM ran in the run's dtype only, and mini_engine's fp32 check speaks for mini_engine."""
    pairs = [p for p in all_server_pairs(res) if p[1].num_same_text is not None] \
        if res.vllm and not res.settings.base_url else []
    if not pairs:
        return []
    same = sum(on.num_same_text for _, on in pairs)
    total = sum(on.level.num_users for _, on in pairs)
    if same == total:
        return [f"vLLM's greedy text was the same with speculation on: {same}/{total} requests"]
    return [f"vLLM's greedy text changed in {total - same} of {total} requests with speculation "
            f"on; why was not checked (vLLM ran in {res.header.dtype} only; the fp32 check above "
            "is mini_engine's)"]


def insights(res: SpeculativeDecoding) -> list[str]:
    """At most five lines, each result once: correct, one copy request, many, chat, vLLM's
    text."""
    return [correct_line(res), pays_line(res), many_line(res), chat_line(res)] + \
        vllm_text_line(res)
