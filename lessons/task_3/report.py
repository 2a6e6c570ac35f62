"""Task 3's report (task_3_kv_cache_problem.py prints it once it has simulated): each request's
reservation against what it uses, the users that fit, the slots in bytes (common.kv, shared
with task 4), and the insight lines chosen from the figures. Printing only."""
from __future__ import annotations

from common import kv, report


def print_report(args, model, contiguous: kv.AllocationSummary, mean_used: int,
                 users_contiguous: int, users_ideal: int, in_bytes: kv.KVBytes) -> None:
    report.title("Task 3: The KV Cache Problem - Why Memory Matters")
    report.row("Pre-allocated per request", f"{args.max_len} token slots")
    report.row("Concurrent requests", len(args.lengths))
    print_requests(args, contiguous)
    print_users(args, mean_used, users_contiguous, users_ideal)
    kv.print_kv_bytes(model, in_bytes)
    report.detail_hint()           # the model's source and path went to the detail
    report.insight(insights(args, contiguous, users_contiguous, users_ideal))


def print_requests(args, contiguous: kv.AllocationSummary) -> None:
    report.section("SIMULATING CONTIGUOUS ALLOCATION")
    report.note(f"(Each request gets {args.max_len} token slots, regardless of actual usage)")
    for i, (name, a) in enumerate(zip(args.names, contiguous.allocations), start=1):
        report.note(f"Request {i} ({name}): {a.num_used}/{a.num_allocated} used "
                    f"({a.waste_pct:.1f}% wasted)", indent=2)
        report.note(report.bar(a.num_used, a.num_allocated), indent=4)
    report.section("SUMMARY")
    report.row("Total allocated", f"{contiguous.num_allocated} token slots")
    report.row("Total actually used", f"{contiguous.num_used} token slots")
    report.row("Memory utilization", f"{contiguous.utilization_pct:.1f}%")
    report.row("Overall waste", f"{contiguous.waste_pct:.1f}%")


def print_users(args, mean_used: int, users_contiguous: int, users_ideal: int) -> None:
    report.section("CONCURRENT USER IMPACT")
    report.note(f"With {args.total_slots} total memory slots:", indent=2)
    report.note(f"- Contiguous allocation: {users_contiguous} users max "
                f"({args.total_slots} // {args.max_len})", indent=2)
    report.note(f"- Ideal (no waste):      {users_ideal} users max "
                f"({args.total_slots} // {mean_used}, the mean request)", indent=2)
    if users_contiguous:
        report.note(f"- You are serving {users_ideal / users_contiguous:.1f}x fewer users "
                    f"than possible!", indent=2)


def insights(args, contiguous: kv.AllocationSummary, users_contiguous: int,
             users_ideal: int) -> list[str]:
    """Three claims, each from the simulation's figures."""
    return [
        f"Contiguous allocation reserves the worst case, {args.max_len} token slots, for every "
        "request, because nobody knows in advance how long an answer will be.",
        f"Here {contiguous.waste_pct:.1f}% of the reserved KV memory holds nothing.",
        f"The waste caps how many users fit, {users_contiguous} instead of {users_ideal} in "
        f"{args.total_slots:,} slots, not how fast each one is served.",
    ]
