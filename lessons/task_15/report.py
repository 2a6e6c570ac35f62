"""Task 15's report: the same client, the same load, what the front door costs and where it
goes, the source's 12.6x read again; then the KEY INSIGHT lines, each chosen from the figures.
What a learner does not need to follow the lesson (the 1-user split, each failed request, how
each range is made) is printed inside report.detail()."""
from __future__ import annotations

from common import fmt, report
from lessons.task_15.record import ServerRun, ThreeServers, ratio

# two paces (a server's ratio against its engine's) or first-token times "are" the same within
# this share
SAME_PACE = 0.10
# a server whose tokens/s beat its own offline way's by more than 1 / KEPT is no price of its
# front door: the offline way pays for something the server does not
KEPT = 0.90
# the parts of a request's time against offline (costs): the names the report prints
FIRST, STEPS, TO_CLIENT, STEPS_AND_CLIENT = ("first token", "slower steps", "engine to client",
                                             "steps and streaming")


def cores(res: ThreeServers) -> str:
    """'2 cores', the cores the run used (the step, the server and the client alike)."""
    n = res.header.threads
    return "the same cores" if not n else f"{n} core{'s' * (n != 1)}"


def of(way: str) -> str:
    """The possessive: "vLLM's", "transformers'"."""
    return f"{way}'" if way.endswith("s") else f"{way}'s"


def users(n: int) -> str:
    return f"{n} user{'s' * (n != 1)}"


def costs(r: ServerRun, num_users: int, num_tokens: int) -> dict[str, float] | None:
    """Where a served request's time went beyond its engine's offline run, in seconds over its
    life: its first token later (arrivals spread out, HTTP, tokenizing, prefill in pieces);
    each later token's step slower inside the server (the engine's own inter-token latency from
    /metrics against its offline step: the serving process's work, its event loop, JSON, SSE
    and detokenizing, and the load generator, all on the same cores as the step); and each
    later token delayed between the engine and the client (HTTP and SSE in transit). Without
    /metrics the last two are one. None: not measured."""
    off, lv = r.offline_run(num_users), r.level(num_users)
    if off is None or lv is None or not lv.num_ok or lv.mean_tpot_s is None:
        return None
    later = num_tokens - 1
    found = {FIRST: lv.mean_ttft_s - off.first_token_s.median}
    if lv.engine_itl_s is None:
        found[STEPS_AND_CLIENT] = (lv.mean_tpot_s - off.step_s.median) * later
    else:
        found[STEPS] = (lv.engine_itl_s - off.step_s.median) * later
        found[TO_CLIENT] = (lv.mean_tpot_s - lv.engine_itl_s) * later
    return found


def first_token_unpriced(r: ServerRun, n: int) -> bool:
    """The offline way's first tokens came later than the server's by more than SAME_PACE: it
    pays for something the server does not (transformers' generate_batch starts its batching
    thread at every call), so the pair does not price the door."""
    off, lv = r.offline_run(n), r.level(n)
    return bool(off and lv and lv.mean_ttft_s is not None
                and lv.mean_ttft_s < (1 - SAME_PACE) * off.first_token_s.median)


def prices(r: ServerRun, n: int, largest: int) -> bool:
    """This server and its offline way price its front door at n users: both measured, the
    server no faster than offline by more than 1 / KEPT, and (at the most users, where first
    tokens take tenths of a second) the offline first tokens not the later ones."""
    door = r.door(n)
    return (door is not None and door <= 1 / KEPT
            and not (n == largest and first_token_unpriced(r, n)))


# --- the report's parts --------------------------------------------------------------------------
def print_calls(runs: list[ServerRun]) -> None:
    report.section("1. THE SAME CLIENT, THREE SERVERS (task 5's call)")
    rows = []
    for r in runs:
        if r.skipped:
            rows.append((r.way, "-", "-", "-", " did not run"))
            continue
        answer = r.sdk_call.text.strip().replace("\n", " ")
        rows.append((r.way, "reused" if r.startup_s is None else f"{r.startup_s:.1f}",
                     fmt.secs(r.first_request_s), fmt.secs(r.sdk_call.latency_s),
                     " " + ((answer[:23] + "...") if len(answer) > 26 else answer)))
    report.table(["Server", "Ready s", "1st s", "SDK s", "  Answer (start)"], rows,
                 widths=[13, 10, 7, 8, 27], align_left=(0, 4))
    with report.detail():
        report.note("Ready: until /health answered. 1st: its first request, a warm-up timed "
                    "apart. SDK: the official openai client, only base_url changed (one call).")
    for r in runs:
        if r.skipped:
            report.note(f"{r.way} did not run: {r.skipped}")


def print_levels(res: ThreeServers, runs: list[ServerRun]) -> None:
    """The fewest and the most users here (the door is priced at those), the levels between
    them in the detail."""
    report.section("2. THE SAME LOAD (task 6's levels)")
    ends = {min(res.users), res.largest}
    print_level_rows(runs, ends)
    between = sorted(set(res.users) - ends)
    report.note(f"{report.term('TTFT')}; {report.term('TPOT')}, at the client; Engine: the "
                f"server's own {report.term('ITL')}, from /metrics.")
    with report.detail():
        report.note(f"Each level's median pass of {res.num_passes} (the range: all of them). "
                    "Engine '-': the server has no /metrics.")
        if between:
            report.note(f"The levels between, {', '.join(map(str, between))} users:")
            print_level_rows(runs, set(between))
        for r in runs:
            for lv in r.levels:
                for error in lv.errors:
                    report.note(f"{r.way}, {users(lv.num_users)}, failed: {error}", indent=2)


def print_level_rows(runs: list[ServerRun], counts: set[int]) -> None:
    rows = []
    for r in runs:
        for lv, s in zip(r.levels, r.spreads):
            if lv.num_users not in counts:
                continue
            spread = f"{s.median:.0f} ({s.low:.0f}-{s.high:.0f})" if s.num_passes > 1 else \
                f"{lv.tokens_per_s:.1f}"
            rows.append((r.way, lv.num_users, spread, fmt.secs(lv.mean_ttft_s),
                         fmt.ms(lv.mean_tpot_s), fmt.ms(lv.engine_itl_s),
                         f"{lv.num_ok}/{lv.num_users}"))
    report.table(["Server", "Users", "Tok/s (range)", "TTFT s", "TPOT ms", "Engine ms", "OK"],
                 rows, widths=[13, 6, 15, 7, 8, 10, 6], align_left=(0,))


def print_door(res: ThreeServers, runs: list[ServerRun]) -> None:
    report.section("3. WHAT THE FRONT DOOR COSTS")
    if not any(r.offline or r.offline_error for r in runs):
        report.note(f"Not measured: no engine ran offline (--no-offline), so the "
                    f"{report.term('front door')} was not priced.")
        return
    counts = sorted({min(res.users), res.largest})
    report.note(f"The {report.term('front door')}, priced on the same requests:")
    rows = []
    for r in runs:
        for n in counts:
            alone, served, span = r.offline_at(n), r.level(n), r.door_range(n)
            rows.append((r.way, n, "-" if alone is None else f"{alone.median:.1f}",
                         "-" if served is None else f"{served.tokens_per_s:.1f}",
                         fmt.times(r.door(n)) + (f" ({span[0]:.2f}-{span[1]:.2f})" if span and
                                                 res.num_passes > 1 else "")))
    report.table(["Server", "Users", "Offline", "Served", "Served/offline"], rows,
                 widths=[13, 6, 10, 10, 26], align_left=(0,))
    with report.detail():
        report.note("Served: its level's median pass. The range: the lowest served pass over "
                    "the highest offline one, and the other way.")
    for r in runs:
        if r.offline_error:
            report.note(f"{r.way} offline failed: {r.offline_error}")
    for r in runs:
        line = unpriced_line(r, res)
        if line:
            report.note(line)
    print()
    n = res.largest
    report.note(f"Where a request's time went at {n} users, served against offline:")
    print_steps(runs, [n])
    with report.detail():
        print_steps(runs, [c for c in counts if c != n])
    report.note("Step: offline (the tokens after the first) -> the engine in its server (its "
                "ITL) -> the client (TPOT).")


def print_steps(runs: list[ServerRun], counts: list[int]) -> None:
    rows = []
    for r in runs:
        for n in counts:
            off, lv = r.offline_run(n), r.level(n)
            if off is None or lv is None:
                continue
            rows.append((r.way, n, f"{fmt.secs(off.first_token_s.median)} -> "
                                   f"{fmt.secs(lv.mean_ttft_s)}",
                         f"{fmt.ms(off.step_s.median)} -> {fmt.ms(lv.engine_itl_s)} -> "
                         f"{fmt.ms(lv.mean_tpot_s)}"))
    if rows:
        report.table(["Server", "Users", "First token (s)", "Step (ms)"], rows,
                     widths=[13, 6, 20, 26], align_left=(0,))


def unpriced_line(r: ServerRun, res: ThreeServers) -> str | None:
    """Why a server's served/offline is no price of its door, where it is not (else None)."""
    n, one = res.largest, min(res.users)
    if first_token_unpriced(r, n):
        off, lv = r.offline_run(n), r.level(n)
        return (f"{of(r.way)} offline way is no price of its door: its first tokens took "
                f"{fmt.secs(off.first_token_s.median)} s offline, {fmt.secs(lv.mean_ttft_s)} s "
                f"served, at {users(n)}.")
    for count in sorted({one, n}):
        door = r.door(count)
        if door is not None and door > 1 / KEPT:
            return (f"{of(r.way)} offline way is no price of its door: its server made "
                    f"{fmt.times(door)} its tokens/s at {users(count)}.")
    return None


def print_scaling(res: ThreeServers, runs: list[ServerRun]) -> None:
    one, many = min(res.users), res.largest
    if one == many:
        return
    report.section(f"4. THE SOURCE'S 12.6x, READ AGAIN ({many} users over {one})")
    served, offline = [], []
    for r in runs:
        served.append(ratio(*(lv.tokens_per_s if lv else None
                              for lv in (r.level(many), r.level(one)))))
        offline.append(ratio(*(s.median if s else None
                               for s in (r.offline_at(many), r.offline_at(one)))))
    if not any(offline):
        parts = ", ".join(f"{r.way} {fmt.times(s, 1)}" for r, s in zip(runs, served))
        report.note(f"Through each server: {parts}. The source's 12.6x (task 6) is this kind.")
        return
    parts = ", ".join(f"{r.way} {fmt.times(s, 1)} ({fmt.times(o, 1)})"
                      for r, s, o in zip(runs, served, offline))
    report.note(f"Through each server (offline): {parts}. The source's 12.6x (task 6) is the "
                "first kind.")


def print_report(res: ThreeServers) -> None:
    ran = [r for r in res.servers if not r.skipped]
    print_calls(res.servers)
    print_levels(res, ran)
    print_door(res, ran)
    print_scaling(res, ran)
    report.detail_hint()
    report.insight(insights(res))


# --- the KEY INSIGHT -----------------------------------------------------------------------------
def insights(res: ThreeServers) -> list[str]:
    lines = [line for line in (against_line(res), door_line(res), split_line(res),
                               scaling_line(res)) if line]
    if not lines:
        return ["No server ran: nothing to compare."]
    if not any(r.offline for r in res.servers if not r.skipped):
        lines.append("No engine ran offline (--no-offline), so what each front door costs "
                     "was not measured.")
    return lines


def against_line(res: ThreeServers) -> str | None:
    """mini_engine's server against vLLM's, or against transformers' where vLLM's did not run."""
    n = res.largest
    mini = res.server("mini_engine")
    other = res.server("vLLM") or res.server("transformers")
    if not (mini and other and mini.level(n) and other.level(n) and mini.level(n).num_ok
            and other.level(n).tokens_per_s > 0):
        return None
    a, b = mini.level(n).tokens_per_s, other.level(n).tokens_per_s
    sa, sb = mini.spread(n), other.spread(n)
    if sa.num_passes < 2:
        return (f"At {n} users mini_engine's server made {a:.0f} tokens/s and "
                f"{of(other.way)} {b:.0f}: {fmt.times(a / b)} (one pass each).")
    if sa.overlaps(sb):
        return (f"At {n} users mini_engine's server made {a:.0f} tokens/s and "
                f"{of(other.way)} {b:.0f}: {fmt.times(a / b)}, not told apart (their passes "
                "overlap).")
    return (f"At {n} users mini_engine's server made {a:.0f} tokens/s and {of(other.way)} "
            f"{b:.0f}: {fmt.times(a / b)}, their passes apart.")


def door_line(res: ThreeServers) -> str | None:
    """Each server's served over offline tokens/s at the most users (at the fewest: the
    scaling line, the table and the figure)."""
    n = res.largest
    ran = [r for r in res.servers if not r.skipped and r.door(n) is not None]
    if not ran:
        return None
    parts = ", ".join(f"{r.way} {fmt.times(r.door(n))}" for r in ran)
    return f"Each server kept this share of its engine's offline tokens/s at {n} users: {parts}."


def split_line(res: ThreeServers) -> str | None:
    """Where the time went for the server whose door cost the most at the most users (of those
    whose offline way prices it), and why, chosen by the largest part that came later."""
    n = res.largest
    priced = [r for r in res.servers if not r.skipped and prices(r, n, n)
              and costs(r, n, res.max_tokens)]
    if not priced:
        return None
    r = min(priced, key=lambda run: run.door(n))
    split = costs(r, n, res.max_tokens)
    off, lv = r.offline_run(n), r.level(n)
    head = f"{of(r.way)} request of {res.max_tokens} tokens against offline"
    if STEPS_AND_CLIENT in split:
        return (f"{head}: first token {split[FIRST]:+.2f} s, {STEPS_AND_CLIENT} "
                f"{split[STEPS_AND_CLIENT]:+.2f} s ({fmt.ms(off.step_s.median)} -> "
                f"{fmt.ms(lv.mean_tpot_s)} ms a token; with no /metrics, one figure).")
    parts = (f"first token {split[FIRST]:+.2f} s, steps {split[STEPS]:+.2f} s "
             f"({fmt.ms(off.step_s.median)} -> {fmt.ms(lv.engine_itl_s)} ms), {TO_CLIENT} "
             f"{split[TO_CLIENT]:+.2f} s")
    later = {name: value for name, value in split.items() if value > 0}
    if not later:
        return (f"{head}: {parts}. No part of a request came later, so the loss lies between "
                "the requests (their arrivals spread out).")
    largest = max(later, key=later.get)
    if largest == STEPS:
        return (f"{head}: {parts}. Its steps slowed beside the server's work (event loop, "
                f"JSON, SSE, detokenizing) and the load generator on {cores(res)}.")
    if largest == TO_CLIENT:
        return (f"{head}: {parts}. Most of it came between the engine and the client: HTTP "
                "and SSE delayed each token after its step.")
    return (f"{head}: {parts}. Most of it is a later first token: the requests arrive over "
            "HTTP, are tokenized, and join the batch over several steps.")


def scaling_line(res: ThreeServers) -> str | None:
    """The source's 12.6x is a server's ratio: it moves with what the front door costs at 1
    user against at 20. Told of the server whose ratio strays most from its engine's."""
    one, many = min(res.users), res.largest
    found = [r for r in res.servers if not r.skipped and one != many
             and prices(r, one, many) and prices(r, many, many)]
    if not found:
        return None
    r = max(found, key=lambda run: abs(run.door(many) / run.door(one) - 1))
    served = r.level(many).tokens_per_s / r.level(one).tokens_per_s
    offline = r.offline_at(many).median / r.offline_at(one).median
    skew = r.door(many) / r.door(one)
    ratio = (f"{of(r.way)} ratio of {many} users over {one} is {fmt.times(served, 1)} through "
             f"its server and {fmt.times(offline, 1)} offline")
    kept = (f"its door kept {fmt.times(r.door(many))} at {many} users and "
            f"{fmt.times(r.door(one))} at {one}")
    if abs(skew - 1) <= SAME_PACE:
        return (f"Each server's ratio of {many} users over {one} is within {SAME_PACE:.0%} of its "
                f"engine's offline one ({of(r.way)} the most apart: {fmt.times(served, 1)} "
                f"against {fmt.times(offline, 1)}), so a server's ratio, as the source's 12.6x, "
                "is its batching's.")
    if skew < 1:
        return f"{ratio}: {kept}, so its server's ratio understates its batching."
    return f"{ratio}: {kept}, so its server's ratio overstates its batching."
