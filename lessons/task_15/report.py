"""Task 15's report: the same client, the same load, what the front door costs and where it
goes, the source's 12.6x read again; then the KEY INSIGHT lines, each chosen from the figures."""
from __future__ import annotations

from common import load, report
from lessons.task_15.record import ServerRun, ThreeServers, ratio

# the client's time per output token "is" the engine's own inter-token latency within this share
# (the front door adds nothing measurable to the pace)
SAME_PACE = 0.10
# a server "kept" its engine's speed when server / offline is at least this
KEPT = 0.90


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f}"


def times(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}x"


def of(way: str) -> str:
    """The possessive: "vLLM's", "transformers'"."""
    return f"{way}'" if way.endswith("s") else f"{way}'s"


def costs(r: ServerRun, num_users: int, num_tokens: int) -> dict[str, float] | None:
    """Where a served request's time went beyond its engine's offline run, in seconds over its
    life: its first token later (arrivals spread out, HTTP, tokenizing, prefill in pieces),
    each later token's step slower (the serving process's work beside the step), and each
    later token delayed between the engine and the client (the API server, streaming, HTTP).
    Without the server's own inter-token latency the last two are one. None: not measured."""
    off, lv = r.offline_run(num_users), r.level(num_users)
    if off is None or lv is None or not lv.num_ok or lv.mean_tpot_s is None:
        return None
    later = num_tokens - 1
    found = {"first token": lv.mean_ttft_s - off.first_token_s.median}
    if lv.engine_itl_s is None:
        found["steps and HTTP"] = (lv.mean_tpot_s - off.step_s.median) * later
    else:
        found["steps"] = (lv.engine_itl_s - off.step_s.median) * later
        found["HTTP and streaming"] = (lv.mean_tpot_s - lv.engine_itl_s) * later
    return found


def print_calls(runs: list[ServerRun]) -> None:
    report.section("1. THE SAME CLIENT, THREE SERVERS (task 5's call)")
    rows = []
    for r in runs:
        if r.skipped:
            rows.append((r.way, "-", "-", "-", " did not run"))
            continue
        answer = r.sdk_call.text.strip().replace("\n", " ")
        rows.append((r.way, "reused" if r.startup_s is None else f"{r.startup_s:.1f}",
                     f"{r.first_request_s:.2f}", f"{r.sdk_call.latency_s:.2f}",
                     " " + ((answer[:23] + "...") if len(answer) > 26 else answer)))
    report.table(["Server", "Ready s", "1st s", "SDK s", "  Answer (start)"], rows,
                 widths=[13, 10, 7, 8, 27], align_left=(0, 4))
    report.note("Ready: until /health answered. 1st: its first request, a warm-up timed apart. "
                "SDK: the official openai client, only base_url changed (one call).")
    for r in runs:
        if r.skipped:
            report.note(f"{r.way} did not run: {r.skipped}")


def print_levels(res: ThreeServers, runs: list[ServerRun]) -> None:
    report.section("2. THE SAME LOAD (task 6's levels)")
    rows = []
    for r in runs:
        for lv, s in zip(r.levels, r.spreads):
            spread = f"{s.median:.0f} ({s.low:.0f}-{s.high:.0f})" if s.num_passes > 1 else \
                f"{lv.tokens_per_s:.1f}"
            rows.append((r.way, lv.num_users, spread, load.seconds(lv.mean_ttft_s),
                         ms(lv.mean_tpot_s), ms(lv.engine_itl_s), f"{lv.num_ok}/{lv.num_users}"))
    report.table(["Server", "Users", "Tok/s (range)", "TTFT s", "TPOT ms", "Engine ms", "OK"],
                 rows, widths=[13, 6, 15, 7, 8, 10, 6], align_left=(0,))
    report.note(f"Each level's median pass of {res.num_passes}, the range of all of them. TPOT: "
                "the client's time per output token. Engine: the server's own mean inter-token "
                "latency from its /metrics, stamped as each step's tokens leave the engine "
                "('-': transformers serve has no /metrics).")
    for r in runs:
        for lv in r.levels:
            for error in lv.errors:
                report.note(f"{r.way}, {lv.num_users} users, failed: {error}", indent=2)


def print_door(res: ThreeServers, runs: list[ServerRun]) -> None:
    report.section("3. WHAT THE FRONT DOOR COSTS")
    if not any(r.offline or r.offline_error for r in runs):
        report.note("Not measured: no engine ran offline (--no-offline).")
        return
    counts = sorted({min(res.users), res.largest})
    rows = []
    for r in runs:
        for n in counts:
            alone, served, span = r.offline_at(n), r.level(n), r.door_range(n)
            rows.append((r.way, n, "-" if alone is None else f"{alone.median:.1f}",
                         "-" if served is None else f"{served.tokens_per_s:.1f}",
                         times(r.door(n)) + (f" ({span[0]:.2f}-{span[1]:.2f})" if span and
                                             res.num_passes > 1 else "")))
    report.table(["Server", "Users", "Offline", "Served", "Served/offline"], rows,
                 widths=[13, 6, 10, 10, 26], align_left=(0,))
    report.note("Tokens/s of the same requests: the server's engine with no server in front "
                "(Offline), and through the server (Served, its level's median pass). The "
                "range: the lowest served pass over the highest offline one, and the other way.")
    for r in runs:
        if r.offline_error:
            report.note(f"{r.way} offline failed: {r.offline_error}")
    print()
    report.note("Where the difference goes, each request (first token: offline, the whole "
                "batch's; served, the mean TTFT):")
    rows = []
    for r in runs:
        for n in counts:
            off, lv = r.offline_run(n), r.level(n)
            if off is None or lv is None:
                continue
            rows.append((r.way, n, f"{off.first_token_s.median:.2f} -> "
                                   f"{load.seconds(lv.mean_ttft_s)}",
                         f"{ms(off.step_s.median)} -> {ms(lv.engine_itl_s)} -> "
                         f"{ms(lv.mean_tpot_s)}"))
    report.table(["Server", "Users", "First token (s)", "Step (ms)"], rows,
                 widths=[13, 6, 20, 26], align_left=(0,))
    report.note("First token: offline -> served. Step, a later token's: offline (the rest of "
                "its run over the tokens after the first) -> the server's engine (its own "
                "inter-token latency, from /metrics, before HTTP; '-': no /metrics) -> the "
                "client (TPOT).")


def print_scaling(res: ThreeServers, runs: list[ServerRun]) -> None:
    one, many = min(res.users), res.largest
    if one == many:
        return
    report.section(f"4. THE SOURCE'S 12.6x, READ AGAIN ({many} users over {one})")
    rows = []
    for r in runs:
        served = ratio(*(lv.tokens_per_s if lv else None for lv in (r.level(many), r.level(one))))
        offline = ratio(*(s.median if s else None for s in (r.offline_at(many),
                                                             r.offline_at(one))))
        rows.append((r.way, times(served, 1), times(offline, 1)))
    report.table(["Server", "Through the server", "Offline"], rows, widths=[13, 20, 10],
                 align_left=(0,))
    report.note(f"The source's 12.6x (task 6, 20 users over 1) is the first kind: a server's "
                f"tokens/s at {many} users over its own at {one}.")


def print_report(res: ThreeServers) -> None:
    ran = [r for r in res.servers if not r.skipped]
    print_calls(res.servers)
    print_levels(res, ran)
    print_door(res, ran)
    print_scaling(res, ran)
    report.insight(insights(res))


def insights(res: ThreeServers) -> list[str]:
    lines = []
    n = res.largest
    mini = res.server("mini_engine")
    # mini_engine's server against vLLM's, or against transformers' where vLLM's did not run
    other = res.server("vLLM") or res.server("transformers")
    if (mini and other and mini.level(n) and other.level(n) and mini.level(n).num_ok
            and other.level(n).tokens_per_s > 0):
        a, b = mini.level(n).tokens_per_s, other.level(n).tokens_per_s
        sa, sb = mini.spread(n), other.spread(n)
        apart = sa.num_passes > 1 and not sa.overlaps(sb)
        lines.append(f"At {n} users mini_engine's server made {a:.0f} tokens/s, "
                     f"{of(other.way)} {b:.0f}: {a / b:.2f}x" + (
                         ", their passes apart" if apart else
                         ", within each other's passes: not told apart" if sa.num_passes > 1
                         else " (one pass each)"))
    for r in res.servers:
        if r.skipped:
            continue
        line = door_line(r, res)
        if line:
            lines.append(line)
    scaling = scaling_line(res)
    if scaling:
        lines.append(scaling)
    if not any(r.offline for r in res.servers if not r.skipped) and lines:
        lines.append("No engine ran offline (--no-offline), so what each front door costs "
                     "was not measured")
    return lines or ["No server ran: nothing to compare"]


def door_line(r: ServerRun, res: ThreeServers) -> str | None:
    """What the server kept of its engine's speed at the most users, and where the rest went."""
    n, one = res.largest, min(res.users)
    door = r.door(n)
    if door is None:
        return None
    at_one = f" ({r.door(one):.2f}x at {one})" if r.door(one) is not None and one != n else ""
    if door > 1 / KEPT:
        off, lv = r.offline_run(n), r.level(n)
        head = (f"{of(r.way)} server made {door:.2f}x the tokens/s of its own offline way at "
                f"{n} users{at_one}, so this pair does not price its front door")
        if lv.mean_ttft_s is not None and lv.mean_ttft_s < off.first_token_s.median:
            return head + (f": offline, the first tokens took {off.first_token_s.median:.2f} s, "
                           f"through the server {lv.mean_ttft_s:.2f} s")
        return head
    head = f"{of(r.way)} server kept {door:.2f}x of its engine's offline speed at {n} users{at_one}"
    split = costs(r, n, res.max_tokens)
    if not split:
        return head
    parts = ", ".join(f"{name} {value:+.2f} s" for name, value in split.items())
    if door >= KEPT:
        return head + f": the front door costs it little (a request against offline: {parts})"
    later = {name: value for name, value in split.items() if value > 0}
    if not later:
        return head + (f". A request against offline: {parts}: no part of a request came "
                       "later, so the loss is between the requests (their arrivals spread out)")
    largest = max(later, key=later.get)
    share = later[largest] / sum(later.values())
    return head + f". A request against offline: {parts}: " + (
        f"most of the loss is its {largest}" if share > 0.5 else
        f"its {largest} the largest part ({share:.0%} of what came later)")


def scaling_line(res: ThreeServers) -> str | None:
    """The source's 12.6x is a server's ratio: it moves with what the front door costs at 1
    user against at 20."""
    one, many = min(res.users), res.largest
    found = []
    for r in res.servers:
        d1, dn = r.door(one), r.door(many)
        if not r.skipped and d1 and dn and max(d1, dn) <= 1 / KEPT:   # a door that prices
            found.append((r.way, r.level(many).tokens_per_s / r.level(one).tokens_per_s,
                          r.offline_at(many).median / r.offline_at(one).median, dn / d1))
    if one == many or not found:
        return None
    parts = ", ".join(f"{way} {s:.1f}x ({o:.1f}x offline)" for way, s, o, _ in found)
    way, _, _, skew = max(found, key=lambda f: abs(f[3] - 1))
    head = f"{many} users over {one}, through each server: {parts}"
    if abs(skew - 1) <= SAME_PACE:
        return head + (f": each within {SAME_PACE:.0%} of its engine's own, the door costing "
                       "about the same at both ends, so a server's ratio, as the source's "
                       "12.6x, is its batching's")
    if skew < 1:
        return head + (f": {of(way)} door costs more at {many} users than at {one}, so its "
                       f"server's ratio ({skew:.2f}x its engine's) understates its batching")
    return head + (f": {of(way)} door costs more at {one} user than at {many}, so its server's "
                   f"ratio ({skew:.2f}x its engine's) overstates its batching: a slow 1-user "
                   "baseline, as task 6 once measured, inflates a ratio like the source's 12.6x")
