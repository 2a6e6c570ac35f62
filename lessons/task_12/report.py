"""Task 12's report (task_12_speculative_decoding.py prints it, in this order): what ran, then the
three parts (correct, mini_engine measured, vLLM) and the KEY INSIGHT lines, each a whole sentence
chosen from the figures it states. What a learner does not need to follow the lesson (each
round's range, the time per output token, the notes on how a figure is counted) is printed
inside report.detail(). Printing only: the script measures, these print its record
(lessons/task_12/record.py), read by attribute."""
from __future__ import annotations

from common import fmt, measure, report
from lessons.task_12.record import WORKLOADS, EngineRun, ServerRun, SpeculativeDecoding
from lessons.task_12.workloads import INSTRUCTION

LABEL_WIDTH = 25        # the tables' first column; the runs share the other 40
SOURCE_SPEEDUP = "1.1x"  # the source's vLLM over HuggingFace, one request (its section 10)
ABOUT_THE_SAME = 1.25   # a step with guesses taking at most this much the time: "only"


def print_run_info(model_choice, dtype, threads: int, s, w, source_note: str | None) -> None:
    report.title("Task 12: Guess, Then Check - Speculative Decoding")
    vllm = ("" if not s.is_vllm_measured else
            f" (--base-url {s.base_url} for vLLM, at its own setting)" if s.base_url else
            " and vLLM's server (prefix caching off)")
    report.run_info(model_choice, dtype, threads)
    report.note(f"Engine: mini_engine{vllm}, batch cap {s.num_requests}, "
                f"{report.term('greedy')}.")
    report.note(f"Speculation: {report.term('speculative decoding')}, guessing by n-gram "
                f"prompt lookup (vLLM's ngram, n = {s.prompt_lookup_max} down to "
                f"{s.prompt_lookup_min}); k = {', '.join(map(str, s.ks))} guesses a step in "
                f"mini_engine, {s.vllm_k} in vLLM.")
    report.note(f"Workloads: copy (repeat {s.copy_window_tokens} tokens of a text) and chat (the "
                f"lab's questions), {s.output_tokens} tokens an answer; {s.num_sequential} "
                f"requests one at a time, then {s.num_requests} at once.")
    with report.detail():
        report.row("KV cache", f"{s.kv_cache_bytes:,} B (a workload at once in fp32)")
        report.row("mini_engine's kernels", s.kernels)
        report.row("max_model_len", f"{s.max_model_len}, blocks of {s.page_size_tokens}")
        report.row("Copy prompts", f"\"{INSTRUCTION.strip()}\" and a window of {w.source}; "
                                   "EOS held off")
        report.row("Prompt tokens", f"copy {w.min_copy_prompt_tokens}-"
                                    f"{w.max_copy_prompt_tokens}, chat "
                                    f"{w.min_chat_prompt_tokens}-{w.max_chat_prompt_tokens}")
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
    report.detail_hint()
    report.insight(insights(res))


def print_correct(res: SpeculativeDecoding) -> None:
    report.section("1. CORRECT: tokens with guesses and without (fp32)")
    for c in res.correct:
        report.row(f"{c.workload.capitalize()}, k = {c.k} vs off",
                   f"{c.num_identical}/{c.num_requests} requests identical")
    line = dtype_line(res)
    if line:
        report.note(line)
    with report.detail():
        report.note(f"{res.settings.num_requests} requests of each workload at once, at the "
                    "largest k: the most guesses verified and rolled back")
        for c in res.correct:
            report.row(f"{c.workload.capitalize()}, k = {c.k}",
                       f"{c.num_tokens_identical:,}/{c.num_tokens:,} tokens identical, "
                       f"{c.num_accepted_tokens:,} of {c.num_draft_tokens:,} guesses kept")


def dtype_line(res: SpeculativeDecoding) -> str | None:
    """Part 2's requests in the run's dtype against speculation off, where some differ: fp32
    decides whether that is the method (None: every one the same)."""
    changed = [r for r in res.mini_engine if r.num_identical is not None and
               r.num_identical < r.num_requests]
    if not changed:
        return None
    num = sum(r.num_requests - r.num_identical for r in changed)
    total = sum(r.num_requests for r in res.mini_engine if r.k)
    if all(c.num_identical == c.num_requests for c in res.correct):
        return (f"In {res.header.dtype}, {num} of part 2's {total} requests with speculation on "
                f"differ from off; fp32 matched every one, so that is rounding, not the method.")
    return (f"In {res.header.dtype}, {num} of part 2's {total} requests with speculation on "
            f"differ from off, and fp32 differs too.")


def widths(num_runs: int) -> list[int]:
    return [LABEL_WIDTH] + [(report.WIDTH - LABEL_WIDTH) // num_runs] * num_runs


def print_engine(res: SpeculativeDecoding) -> None:
    s = res.settings
    report.section(f"2. MEASURED IN mini_engine ({res.header.dtype})")
    headers = ["Speculation", "off", *(f"k={k}" for k in s.ks)]
    rows, detail = [], []
    for name in WORKLOADS:
        for is_concurrent in (False, True):
            runs: list[EngineRun] = [res.engine_run(name, is_concurrent, k) for k in [0, *s.ks]]
            spreads = [res.engine_speedup_spread(name, is_concurrent, r.k) for r in runs[1:]]
            group = (f"{name.capitalize()}, {level(s, is_concurrent)}",)
            rows += [group,
                     ("  speed-up", *(fmt.times(res.engine_speedup(name, is_concurrent, r.k))
                                      for r in runs)),
                     ("  guesses accepted", *(fmt.pct(r.accepted_share) for r in runs)),
                     ("  steps", *(f"{r.num_steps:,}" for r in runs)),
                     ("  step (ms)", *(fmt.ms(r.mean_step_s) for r in runs))]
            detail += [group,
                       *([("  speed-up, lowest round", "", *(fmt.times(x.low) for x in spreads)),
                          ("  highest round", "", *(fmt.times(x.high) for x in spreads))]
                         if s.num_passes > 1 else []),
                       ("  tokens/s", *(f"{r.tokens_per_s:,.1f}" for r in runs)),
                       ("  tokens a step", *(f"{r.tokens_per_step:.2f}" for r in runs)),
                       ("  ms per output token", *(fmt.ms(r.mean_tpot_s) for r in runs)),
                       ("  tokens as off", "", *(f"{r.num_identical}/{r.num_requests}"
                                                 for r in runs[1:]))]
    report.table(headers, rows, widths(1 + len(s.ks)))
    speedup = (f"Speed-up: tokens/s over off's (the source's vLLM: {SOURCE_SPEEDUP} on one "
               f"request). Step: the run's time over its steps.")
    if s.num_passes > 1:
        report.note(f"{speedup} Off and each k took turns, {s.num_passes} rounds after an "
                    f"untimed one.")
    else:
        report.note(f"{speedup} One pass of each, after an untimed one.")
    with report.detail():
        report.table(headers, detail, widths(1 + len(s.ks)))
        report.note("Tokens a step: a decoding request's, 1 to k + 1. "
                    "Each figure is the median round's, the speed-up the median of the rounds' "
                    "(its range: the lowest and highest round). ms per output token: after a "
                    "request's first, its mean (vLLM's TPOT). Tokens as off: requests whose "
                    "every token is speculation off's.")
        for line in steps_notes(res):
            report.note(line)


def steps_notes(res: SpeculativeDecoding) -> list[str]:
    """Where a run's steps fell by less than a request's tokens a step rose: the run lasts as
    long as its slowest request (more than a third more steps' worth of tokens than off's)."""
    lines = []
    for name in WORKLOADS:
        for k in res.settings.ks:
            off, on = res.engine_run(name, True, 0), res.engine_run(name, True, k)
            if on.num_steps * on.tokens_per_step > 1.33 * off.num_steps:
                lines.append(f"{on.num_requests} {name} requests at once, k = {k}: {off.num_steps}"
                             f" -> {on.num_steps} steps, though a request gained "
                             f"{on.tokens_per_step:.1f} tokens a step: the run lasts as long as "
                             f"its slowest request.")
    return lines


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

    def spread_cells(side: str) -> list[str]:
        spreads = [res.vllm_speedup_spread(name, c) for name in WORKLOADS for c in (False, True)]
        return [fmt.times(getattr(x, side)) if x else "-" for x in spreads]

    report.table(headers, [
        ("Tokens/s, off", *server_cells(res, lambda a, b: f"{a.level.tokens_per_s:,.1f}")),
        (f"  on (k = {s.vllm_k})", *server_cells(res, lambda a, b: f"{b.level.tokens_per_s:,.1f}")),
        ("  speed-up", *server_cells(res, lambda a, b: fmt.times(b.level.tokens_per_s /
                                                                     a.level.tokens_per_s))),
        ("Guesses accepted", *server_cells(res, lambda a, b: fmt.pct(b.accepted_share))),
        ("Tokens a step", *server_cells(res, lambda a, b: "-" if b.tokens_per_step is None
                                         else f"{b.tokens_per_step:.2f}")),
        ("Same greedy text as off", *server_cells(res, lambda a, b: f"{b.num_same_text}/"
                                                                    f"{b.level.num_users}")),
        ("Succeeded, off and on", *(ok(a, b) for a, b in all_server_pairs(res)))],
        widths(4))
    report.note(f"{s.num_sequential}: one request after another; {s.num_requests}: at once.")
    for line in [vllm_text_line(res), *unexplained_lines(res)]:
        report.note(line)
    with report.detail():
        report.table(headers, [
            ("Speed-up, lowest", *spread_cells("low")),
            ("  highest", *spread_cells("high")),
            ("ms per output token, off", *server_cells(res, lambda a, b: tpot(a))),
            ("  on", *server_cells(res, lambda a, b: tpot(b)))], widths(4))
        report.note(f"{s.num_passes} passes of each level in each server, the median's figures; "
                    "the servers ran one after the other, not in turns, so the speed-up's range "
                    "is on's slowest pass over off's fastest to on's fastest over off's slowest. "
                    "Accepted: /metrics' vllm:spec_decode_num_accepted_tokens over "
                    "num_draft_tokens. Tokens a step: as mini_engine's, the decoded tokens (all "
                    "but each answer's first) over the steps that made them, decoded - accepted.")


def unexplained_lines(res: SpeculativeDecoding) -> list[str]:
    """Where vLLM's speed-up passes what its guesses bought (its tokens a step) by over 5 %: the
    rest came from something this task did not measure (its two servers differ in more than
    the guesses)."""
    lines = []
    for name in WORKLOADS:
        for is_concurrent in (False, True):
            on, x = res.server_runs(name, is_concurrent)[1], res.vllm_speedup(name,
                                                                              is_concurrent)
            if x is not None and on.tokens_per_step is not None and \
                    x > 1.05 * on.tokens_per_step:
                lines.append(f"vLLM's {name}, {level(res.settings, is_concurrent)}: "
                             f"{fmt.times(x)}, more than its {on.tokens_per_step:.2f} tokens a "
                             f"step account for; what else made it faster was not measured.")
    return lines


def all_server_pairs(res: SpeculativeDecoding) -> list[tuple[ServerRun, ServerRun]]:
    """Off and on per workload and level, failed requests included (for the count)."""
    def runs(name, c, on):
        return next(r for r in res.vllm if (r.workload, r.is_concurrent, bool(r.k)) ==
                    (name, c, on))
    return [(runs(name, c, False), runs(name, c, True)) for name in WORKLOADS
            for c in (False, True)]


def tpot(run: ServerRun) -> str:
    return fmt.ms(run.level.mean_tpot_s)


def print_external(res: SpeculativeDecoding, headers: list[str]) -> None:
    """A --base-url server at its own setting: what it measured, nothing compared."""
    runs = res.vllm
    report.table(headers, [
        ("Tokens/s (its own)", *(f"{r.level.tokens_per_s:,.1f}" for r in runs)),
        ("ms per output token", *(tpot(r) for r in runs)),
        ("Guesses accepted", *(fmt.pct(r.accepted_share) for r in runs)),
        ("Succeeded", *(f"{r.level.num_ok}/{r.level.num_users}" for r in runs))], widths(4))


# --- the insight ---------------------------------------------------------------------------------
# Each sentence is one whole template, chosen from the figures: a speed-up whose rounds all lie
# over 1 is a gain, all under 1 a loss, and one whose rounds straddle 1 is not told apart from
# speculation off (one round: its one figure decides). Its steps multiply out: tokens/s on over
# off is (off's steps / on's steps) / (on's step / off's step), the same tokens in both.
def outcome(spread: measure.Spread) -> str:
    """'gain', 'loss' or 'even' (the rounds cannot tell it from 1)."""
    low, high = (spread.low, spread.high) if spread.num_passes > 1 else (spread.median,) * 2
    return "gain" if low > 1 else "loss" if high < 1 else "even"


def correct_line(res: SpeculativeDecoding) -> str:
    """A bug or not: fp32 greedy decides (the run's dtype is part 1's note)."""
    bad = [f"{c.workload} k = {c.k} ({c.num_requests - c.num_identical} differ)"
           for c in res.correct if c.num_identical < c.num_requests]
    if bad:
        return f"In fp32, requests differ from speculation off at {', '.join(bad)}: a bug."
    n, k = res.correct[0].num_requests, res.correct[0].k
    return (f"Speculation changed no token: in fp32, {n}/{n} requests of each workload were "
            f"identical to speculation off at k = {k}.")


def step_cost(off: EngineRun, on: EngineRun, spread: measure.Spread) -> str:
    """Why the speed-up came out as it did: the steps it saved against what a step cost with
    its guesses (the bet of speculation, measured), the verdict the speed-up's own."""
    fewer = fmt.times(off.num_steps / on.num_steps)
    dearer = on.mean_step_s / off.mean_step_s
    cost, verdict = fmt.times(dearer), outcome(spread)
    steps = f"{off.num_steps} -> {on.num_steps}"
    if on.num_steps >= off.num_steps and verdict == "loss":
        return f"A loss: no fewer steps ({steps}), each taking {cost} the time."
    if on.num_steps >= off.num_steps and verdict == "gain":
        return f"A gain with no step saved ({steps}): each step took {cost} the time."
    if on.num_steps >= off.num_steps:
        return f"Not told apart from off: no fewer steps ({steps}), each taking {cost} the time."
    if verdict == "gain" and dearer <= ABOUT_THE_SAME:
        return f"A gain: {fewer} fewer steps, each only {cost} the time."
    if verdict == "gain":
        return f"A gain: {fewer} fewer steps outweighed a step taking {cost} the time."
    if verdict == "loss":
        return f"A loss: {fewer} fewer steps did not make up for a step taking {cost} the time."
    return f"Not told apart from off: {fewer} fewer steps, and a step taking {cost} the time."


def pays_line(res: SpeculativeDecoding) -> str:
    """One copy request at a time: mini_engine's best k, and why, from its steps."""
    best = max(res.settings.ks, key=lambda k: res.engine_speedup("copy", False, k))
    off, on = res.engine_run("copy", False, 0), res.engine_run("copy", False, best)
    spread = res.engine_speedup_spread("copy", False, best)
    return f"In mini_engine, one copy request alone: {fmt.times_range(spread)} at k = {best}. " \
        f"{step_cost(off, on, spread)}"


def many_line(res: SpeculativeDecoding) -> str:
    """--requests copies at once, at vLLM's k, and why, from its steps."""
    k, n = res.settings.vllm_k, res.settings.num_requests
    off, on = res.engine_run("copy", True, 0), res.engine_run("copy", True, k)
    spread = res.engine_speedup_spread("copy", True, k)
    return f"{n} copies at once: {fmt.times_range(spread)} at k = {k}. {step_cost(off, on, spread)}"


def chat_line(res: SpeculativeDecoding) -> str:
    """The chat workload at vLLM's k, both levels: whether the guesses paid at either."""
    k, n = res.settings.vllm_k, res.settings.num_requests
    accepted = fmt.pct(res.engine_run("chat", False, k).accepted_share)
    one, many = (res.engine_speedup_spread("chat", c, k) for c in (False, True))
    ratios = f"{fmt.times_range(one)} one at a time, {fmt.times_range(many)} {n} at once"
    if "gain" not in (outcome(one), outcome(many)):
        return f"Chat gained nothing: {accepted} of its guesses were kept; {ratios}."
    return f"Chat: {accepted} of its guesses were kept; {ratios}."


def vllm_line(res: SpeculativeDecoding) -> list[str]:
    """vLLM's ngram at its k on each workload and level, beside mini_engine's at the same k
    where mini_engine's best k (pays_line's) is another."""
    spreads = [res.vllm_speedup_spread(name, c) for name in WORKLOADS for c in (False, True)]
    if not res.vllm or res.settings.base_url or None in spreads:
        return []
    k, n = res.settings.vllm_k, res.settings.num_requests
    copy1, copy_n = (fmt.times_range(x) for x in spreads[:2])
    chat1, chat_n = (fmt.times(x.median) for x in spreads[2:])
    best = max(res.settings.ks, key=lambda x: res.engine_speedup("copy", False, x))
    if best != k:
        mine = fmt.times(res.engine_speedup("copy", False, k))
        return [f"vLLM's ngram at k = {k}: {copy1} for one copy request (mini_engine {mine}), "
                f"{copy_n} for {n}; chat {chat1} and {chat_n}."]
    return [f"vLLM's ngram at k = {k}: {copy1} for one copy request, {copy_n} for {n}; chat "
            f"{chat1} and {chat_n}."]


def vllm_text_line(res: SpeculativeDecoding) -> str | None:
    """Whether vLLM's greedy text changed with speculation on. Why it changed is not said:
    vLLM ran in the run's dtype only, and mini_engine's fp32 check speaks for mini_engine."""
    pairs = [p for p in all_server_pairs(res) if p[1].num_same_text is not None] \
        if res.vllm and not res.settings.base_url else []
    if not pairs:
        return None
    same = sum(on.num_same_text for _, on in pairs)
    total = sum(on.level.num_users for _, on in pairs)
    if same == total:
        return f"vLLM's greedy text was the same with speculation on: {same}/{total} requests."
    return (f"vLLM's greedy text changed in {total - same} of {total} requests with speculation "
            f"on; why was not checked (it ran in {res.header.dtype} only).")


def insights(res: SpeculativeDecoding) -> list[str]:
    """At most five lines, each result once: correct, one copy request, many, chat, vLLM."""
    return [correct_line(res), pays_line(res), many_line(res), chat_line(res)] + \
        vllm_line(res)
