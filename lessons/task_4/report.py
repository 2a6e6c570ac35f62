"""Task 4's report (task_4_paged_attention.py prints it once its block allocator has served the
five requests): each request's blocks, what the pool went through, the comparison with
contiguous allocation, the users that fit, the slots in bytes (common.kv, shared with task 3),
and the insight lines chosen from the figures. Printing only, from the run (PagedRun) the script
measured. The paper calls a block a page (PagedAttention); vLLM says block, and so does this."""
from __future__ import annotations

from common import kv, report


def print_report(args, model, contiguous: kv.AllocationSummary, paged, mean_paged: int,
                 users_contiguous: int, users_paged: int, in_bytes: kv.KVBytes) -> None:
    print_blocks(args, paged)
    print_comparison(args, contiguous, paged, mean_paged, users_contiguous, users_paged)
    kv.print_kv_bytes(model, in_bytes)
    report.detail_hint()           # the model's source and path went to the detail
    report.insight(insights(contiguous, paged))


def print_blocks(args, paged) -> None:
    report.title("Task 4: PagedAttention - vLLM's Solution")
    report.note(f"The KV cache is handed out by the {report.term('block')}.")
    report.row("Block size", f"{args.page_size} tokens per block")
    report.row("Contiguous allocation", f"{args.max_len} slots per request (worst case)")
    report.row("Block pool", f"{paged.num_pool_pages} blocks = "
                             f"{paged.num_pool_pages * args.page_size} slots")
    report.note("(what contiguous allocation reserves for ONE request)", indent=2)
    report.section("BLOCK ALLOCATION (vLLM's PagedAttention)")
    for i, (seq, a, step) in enumerate(zip(paged.sequences, paged.summary.allocations,
                                           paged.finish_steps), start=1):
        blocks = len(seq.page_table)
        report.note(f"Request {i}: {seq.num_tokens} tokens -> {blocks} blocks "
                    f"({a.num_allocated} slots), waste {a.waste_pct:.1f}%", indent=2)
        report.note(f"Blocks: [{'|'.join(['##'] * blocks)}]", indent=4)
        report.note(f"physical block ids: {', '.join(map(str, seq.page_table))}; freed at "
                    f"step {step}", indent=4)
    report.section("THE BLOCK POOL, STEP BY STEP")
    report.note(f"Counted at each {report.term('decode step')}: the blocks in use, and each "
                f"{report.term('preemption')}.")
    report.row("Blocks per request, summed", paged.summary.num_allocated // args.page_size)
    report.row("Most in use at once (peak)", f"{paged.num_pages_peak} of {paged.num_pool_pages}, "
                                             f"first at step {paged.peak_step}")
    report.row("Handed out again after a free", paged.num_pages_reused)
    report.row("Requests preempted", preempted_text(paged.num_preempted))
    report.row("Free after the last finished", f"{paged.num_free_after} of {paged.num_pool_pages}")


def preempted_text(num_preempted: int) -> str:
    if num_preempted:
        return (f"{num_preempted} (pool full: the newest gave its blocks back and started "
                "over)")
    return "0 (the pool never ran out)"


def print_comparison(args, contiguous: kv.AllocationSummary, paged, mean_paged: int,
                     users_contiguous: int, users_paged: int) -> None:
    report.section("SIDE-BY-SIDE COMPARISON")
    rows = [(name, f"{s.num_allocated} slots", f"{s.num_used} slots", f"{s.utilization_pct:.1f}%")
            for name, s in (("Contiguous", contiguous), ("In blocks", paged.summary))]
    report.table(["Method", "Total Allocated", "Total Used", "Utilization"], rows,
                 widths=[12, 18, 14, 13])
    report.note(f"Memory saved: {contiguous.num_allocated - paged.summary.num_allocated} slots "
                f"({contiguous.num_allocated / paged.summary.num_allocated:.1f}x less memory)")
    report.section("CONCURRENT USER IMPACT")
    report.note(f"With {args.total_slots} total memory slots:", indent=2)
    report.note(f"- Contiguous: {users_contiguous} concurrent users "
                f"({args.total_slots} // {args.max_len})", indent=2)
    report.note(f"- In blocks:  {users_paged} concurrent users "
                f"({args.total_slots} // {mean_paged}, the mean request)", indent=2)
    if users_contiguous:
        report.note(f"- Improvement: {users_paged / users_contiguous:.1f}x more users!", indent=2)


# --- the insight: each line chosen from the run's figures ----------------------------------------
def utilisation_line(contiguous: kv.AllocationSummary, paged) -> str:
    before, after = contiguous.utilization_pct, paged.summary.utilization_pct
    if after > before:
        return (f"Blocks raise the utilisation from {before:.1f}% to {after:.1f}%, because a "
                "request wastes less than one block.")
    if after == before:
        return (f"Blocks leave the utilisation where it was, {after:.1f}%: the reservation of "
                "--max-len is already as tight as whole blocks.")
    return (f"Blocks lower the utilisation here, from {before:.1f}% to {after:.1f}%: --max-len "
            "is shorter than the whole blocks a request needs.")


def scattered_line(paged) -> str:
    """Whether any request's blocks lie apart in the pool (ids not one after another)."""
    apart = sum(any(b - a != 1 for a, b in zip(s.page_table, s.page_table[1:]))
                for s in paged.sequences)
    if apart == len(paged.sequences):
        return ("Blocks are handed out as tokens arrive, so every request holds blocks that are "
                "not next to each other (see the physical block ids).")
    if apart:
        return (f"Blocks are handed out as tokens arrive, so {apart} of the {len(paged.sequences)} "
                "requests hold blocks that are not next to each other (see the physical block "
                "ids).")
    return ("Blocks are handed out as tokens arrive; here each request's blocks happened to lie "
            "next to each other.")


def pool_line(paged) -> str:
    peak, pool, reused = paged.num_pages_peak, paged.num_pool_pages, paged.num_pages_reused
    if reused == 1:
        return (f"Requests finish at different times: at most {peak} of the {pool} blocks of "
                "the pool were in use at once, and the one block freed and handed out again "
                "went to a request still growing.")
    if reused:
        return (f"Requests finish at different times: at most {peak} of the {pool} blocks of "
                f"the pool were in use at once, and {reused} freed blocks went to requests "
                "still growing.")
    return (f"At most {peak} of the {pool} blocks of the pool were in use at once, and no freed "
            "block was handed out again.")


def preemption_line(num_preempted: int) -> str:
    if num_preempted == 1:
        return ("The pool filled up once: the newest request gave all its blocks back and "
                "started over.")
    return (f"The pool filled up {num_preempted} times: each time, the newest request gave all "
            "its blocks back and started over.")


def insights(contiguous: kv.AllocationSummary, paged) -> list[str]:
    lines = [utilisation_line(contiguous, paged), scattered_line(paged), pool_line(paged)]
    if paged.num_preempted:
        lines.append(preemption_line(paged.num_preempted))
    return lines
