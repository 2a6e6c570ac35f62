"""Task 4: PagedAttention - vLLM's solution.

Instead of reserving --max-len slots per request, hand out small pages of --page-size tokens
as tokens are generated, the way an OS hands out 4 KB memory pages. A real page allocator (a
free list of page ids) serves the same five requests as task 3, one token at a time,
interleaved as in decoding, from a pool of the memory contiguous allocation reserves for ONE
request; each request's waste is then bounded by one page, and a request that has all its tokens
gives its pages back for the others. Prints the pages per request, what the pool went through
(peak, pages handed out again), the side-by-side comparison with contiguous allocation, the
users that fit, and the bytes for the model the lab runs.

    python task_4_paged_attention.py [--lengths 45,128,23,256,67] [--max-len 512]
                                     [--page-size 16] [--total-slots 10000] [--model M]
"""
from __future__ import annotations

from common import cli, figures, kv, report, results, settings

SCRIPT = "task_4_paged_attention"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_kv_simulation_args(parser)
    parser.add_argument("--page-size", type=cli.positive_int, default=16,
                        help="tokens per page (default 16, vLLM's GPU block size)")
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    args.names = cli.check_kv_simulation_args(parser, args)
    return args


def print_pages(args, paged: kv.PagedRun) -> None:
    report.title("Task 4: PagedAttention - vLLM's Solution")
    report.row("Page size", f"{args.page_size} tokens per page")
    report.row("Contiguous allocation", f"{args.max_len} slots per request (worst case)")
    report.row("Page pool", f"{paged.num_pool_pages} pages = "
                            f"{paged.num_pool_pages * args.page_size} slots")
    report.note("(what contiguous allocation reserves for ONE request)", indent=2)
    report.section("PAGED ALLOCATION (like vLLM's PagedAttention)")
    for i, (seq, a, step) in enumerate(zip(paged.sequences, paged.summary.allocations,
                                           paged.finish_steps), start=1):
        pages = len(seq.page_table)
        report.note(f"Request {i}: {seq.num_tokens} tokens -> {pages} pages "
                    f"({a.num_allocated} slots), waste {a.waste_pct:.1f}%", indent=2)
        report.note(f"Pages: [{'|'.join(['##'] * pages)}]", indent=4)
        report.note(f"physical page ids: {', '.join(map(str, seq.page_table))}; freed at "
                    f"step {step}", indent=4)
    report.section("THE PAGE POOL, STEP BY STEP")
    report.row("Pages per request, summed", paged.summary.num_allocated // args.page_size)
    report.row("Most in use at once (peak)", f"{paged.num_pages_peak} of {paged.num_pool_pages}")
    report.row("Handed out again after a free", paged.num_pages_reused)
    report.row("Requests preempted", f"{paged.num_preempted} (pool full: the newest gave its "
                                     f"pages back and started over)" if paged.num_preempted
               else "0 (the pool never ran out)")
    report.row("Free after the last finished", f"{paged.num_free_after} of {paged.num_pool_pages}")


def print_comparison(args, contiguous: kv.AllocationSummary, paged: kv.PagedRun,
                     mean_paged: int, users_contiguous: int, users_paged: int) -> None:
    report.section("SIDE-BY-SIDE COMPARISON")
    rows = [(name, f"{s.num_allocated} slots", f"{s.num_used} slots", f"{s.utilization_pct:.1f}%")
            for name, s in (("Contiguous", contiguous), ("Paged", paged.summary))]
    report.table(["Method", "Total Allocated", "Total Used", "Utilization"], rows,
                 widths=[12, 18, 14, 13])
    report.note(f"Memory saved: {contiguous.num_allocated - paged.summary.num_allocated} slots "
                f"({contiguous.num_allocated / paged.summary.num_allocated:.1f}x less memory)")
    report.section("CONCURRENT USER IMPACT")
    report.note(f"With {args.total_slots} total memory slots:", indent=2)
    report.note(f"- Contiguous: {users_contiguous} concurrent users "
                f"({args.total_slots} // {args.max_len})", indent=2)
    report.note(f"- Paged:      {users_paged} concurrent users "
                f"({args.total_slots} // {mean_paged}, the mean request)", indent=2)
    if users_contiguous:
        report.note(f"- Improvement: {users_paged / users_contiguous:.1f}x more users!", indent=2)


def insights(contiguous: kv.AllocationSummary, paged: kv.PagedRun) -> list[str]:
    pool_line = (f"Requests finish at different times: at most {paged.num_pages_peak} of the "
                 f"{paged.num_pool_pages}-page pool were in use at once, and "
                 f"{paged.num_pages_reused} freed pages went to requests still growing")
    if paged.num_preempted:
        pool_line += (f"; the pool filled up {paged.num_preempted} time(s), and a request had to "
                      f"start over")
    return [f"Paging raises utilisation from {contiguous.utilization_pct:.1f}% to "
            f"{paged.summary.utilization_pct:.1f}%: waste is under one page per request",
            "Pages are handed out as tokens arrive and need not be contiguous (see the page ids)",
            pool_line]


def result(args, contiguous: kv.AllocationSummary, paged: kv.PagedRun, mean_paged: int,
           users_contiguous: int, users_paged: int, in_bytes: kv.KVBytes) -> results.PagedKV:
    """What task 4 saves (the figure of the pool reads its requests' page ids)."""
    saved = contiguous.num_allocated - paged.summary.num_allocated
    return results.PagedKV(
        paged=results.PagedFigures(
            utilization_pct=round(paged.summary.utilization_pct, 1), extra={
                "allocated": paged.summary.num_allocated, "used": paged.summary.num_used,
                "pool_pages": paged.num_pool_pages, "peak_pages": paged.num_pages_peak,
                "reused_pages": paged.num_pages_reused, "preempted": paged.num_preempted,
                "free_pages_after": paged.num_free_after}),
        users_ratio=round(users_paged / users_contiguous, 1) if users_contiguous else None,
        extra={"settings": {"lengths": args.lengths, "max_len": args.max_len,
                            "page_size": args.page_size, "total_slots": args.total_slots},
               "requests": [{"name": s.name, "tokens": s.num_tokens, "pages": len(s.page_table),
                             "page_ids": s.page_table, "allocated": a.num_allocated,
                             "waste_pct": round(a.waste_pct, 1), "finish_step": step}
                            for s, a, step in zip(paged.sequences, paged.summary.allocations,
                                                  paged.finish_steps)],
               "contiguous": {"allocated": contiguous.num_allocated, "used": contiguous.num_used,
                              "utilization_pct": round(contiguous.utilization_pct, 1)},
               "slots_saved": saved,
               "memory_ratio": round(contiguous.num_allocated / paged.summary.num_allocated, 1),
               "mean_paged_slots": mean_paged, "users_contiguous": users_contiguous,
               "users_paged": users_paged, "in_bytes": in_bytes.to_dict()})


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)

    contiguous = kv.allocate_contiguous(args.lengths, args.max_len)
    # The pool: the memory contiguous allocation reserves for ONE request, cut into pages.
    paged = kv.run_paged(args.lengths, args.names, args.page_size,
                         kv.cdiv(args.max_len, args.page_size))
    # Users that fit: contiguous reserves max_len each; paged needs the mean of the pages it
    # really handed out, in whole slots (544 // 5 = 108 for the source's five requests).
    mean_paged = kv.mean_slots(paged.summary.num_allocated, len(args.lengths))
    users_contiguous = kv.users_that_fit(args.total_slots, args.max_len)
    users_paged = kv.users_that_fit(args.total_slots, mean_paged)
    in_bytes = kv.kv_bytes(
        kv.ModelKV.from_folder(model.path, dtype.dtype), settings.KV_CACHE_BYTES,
        settings.BLOCK_SIZE, settings.MAX_MODEL_LEN,
        slots=[("Contiguous allocated", contiguous.num_allocated),
               ("Paged allocated", paged.summary.num_allocated),
               ("Memory saved", contiguous.num_allocated - paged.summary.num_allocated)],
        users=[(f"Contiguous ({args.max_len} each)", args.max_len),
               (f"Paged ({mean_paged} each)", mean_paged)])

    print_pages(args, paged)
    print_comparison(args, contiguous, paged, mean_paged, users_contiguous, users_paged)
    report.kv_bytes_section(model, in_bytes)
    report.insight(insights(contiguous, paged))

    data = result(args, contiguous, paged, mean_paged, users_contiguous, users_paged, in_bytes)
    figures.saved(results.save(SCRIPT, results.RunHeader.of(model, dtype), data))
    return data.to_dict()


if __name__ == "__main__":
    cli.run(main)
