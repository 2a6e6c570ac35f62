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

from collections import deque
from dataclasses import dataclass, field

from common import cli, figures, kv, report, results, settings
from lessons.task_4 import FIGURES
from lessons.task_4.record import PagedFigures, PagedKV, PagedRequest, PagedSimulation, Slots

SCRIPT = "task_4_paged_attention"


# --- the page allocator ----------------------------------------------------------------------
class OutOfPages(Exception):
    pass


class PageAllocator:
    """A pool of fixed-size pages handed out one at a time from a free list (vLLM's
    BlockPool / nano-vllm's BlockManager)."""

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.num_pages = num_pages
        self.free_pages: deque[int] = deque(range(num_pages))

    @property
    def num_free(self) -> int:
        return len(self.free_pages)

    def allocate(self) -> int:
        if not self.free_pages:
            raise OutOfPages(f"all {self.num_pages} pages are in use")
        return self.free_pages.popleft()

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)


@dataclass
class Sequence:
    """One request's tokens and its page table (logical page i -> physical page id)."""
    name: str
    num_tokens: int = 0
    page_table: list[int] = field(default_factory=list)

    def append_slot(self, allocator: PageAllocator) -> None:
        """Add one token; take a new page only when the last one is full."""
        if self.num_tokens % allocator.page_size == 0:
            self.page_table.append(allocator.allocate())
        self.num_tokens += 1


@dataclass(frozen=True)
class PagedRun:
    sequences: list[Sequence]
    summary: kv.AllocationSummary
    num_pool_pages: int
    num_pages_peak: int     # most pages in use at once (requests finish at different times)
    num_free_after: int     # pages free once every request finished (all back: == pool size)
    num_pages_reused: int   # pages handed out again after the request that had them finished
    num_preempted: int      # times a request gave its pages back to let the others go on
    finish_steps: list[int]  # decode step at which each request had all its tokens
    peak_step: int          # the first step at which num_pages_peak pages were in use
    page_tables_at_peak: list[list[int]]   # each request's pages then ([]: none held)


def run_paged(lengths: list[int], names: list[str], page_size: int, num_pool_pages: int) -> PagedRun:
    """Decode every request at once, one token per request per step, interleaved, so pages are
    handed out as tokens arrive (and a request's pages need not be next to each other). A request
    gives its pages back when it has all its tokens; the free list hands them to the requests
    still growing. A request that finds no free page waits a step; when every request waits (the
    pool is full of unfinished requests), the newest gives all its pages back and starts over
    later, as vLLM's scheduler preempts by recomputation. No request may need more than the pool.
    """
    if max(kv.cdiv(n, page_size) for n in lengths) > num_pool_pages:
        raise OutOfPages(f"a request of {max(lengths)} tokens needs more than the "
                         f"{num_pool_pages} pages of the pool")
    allocator = PageAllocator(num_pool_pages, page_size)
    sequences = [Sequence(name) for name in names]
    finish_steps = [0] * len(sequences)
    handed_out: set[int] = set()
    num_pages_peak = num_reused = num_preempted = step = peak_step = 0
    tables_at_peak: list[list[int]] = [[] for _ in sequences]
    while not all(finish_steps):
        step += 1
        progressed = False
        for seq, done in zip(sequences, finish_steps):
            if done:
                continue
            num_pages = len(seq.page_table)
            try:
                seq.append_slot(allocator)
            except OutOfPages:
                continue                                   # waits for a page to come back
            progressed = True
            if len(seq.page_table) > num_pages:            # this token took a new page
                num_reused += seq.page_table[-1] in handed_out
                handed_out.add(seq.page_table[-1])
        if num_pool_pages - allocator.num_free > num_pages_peak:   # the pool as the figure draws it
            num_pages_peak, peak_step = num_pool_pages - allocator.num_free, step
            tables_at_peak = [[] if done else list(seq.page_table)
                              for seq, done in zip(sequences, finish_steps)]
        for i, (seq, length) in enumerate(zip(sequences, lengths)):
            if not finish_steps[i] and seq.num_tokens == length:
                finish_steps[i] = step
                allocator.free(seq.page_table)             # the pages go back to the pool...
        if not progressed:                                 # ...or the newest one gives its back
            victim = next(s for s, done in zip(reversed(sequences), reversed(finish_steps))
                          if not done and s.page_table)
            allocator.free(victim.page_table)
            victim.page_table, victim.num_tokens = [], 0
            num_preempted += 1
    summary = kv.AllocationSummary([kv.Allocation(s.num_tokens, len(s.page_table) * page_size)
                                    for s in sequences])
    return PagedRun(sequences, summary, num_pool_pages, num_pages_peak, allocator.num_free,
                    num_reused, num_preempted, finish_steps, peak_step, tables_at_peak)


# --- the report ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_kv_simulation_args(parser)
    parser.add_argument("--page-size", type=cli.positive_int, default=16,
                        help="tokens per page (default 16, vLLM's GPU block size)")
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    args.names = cli.check_kv_simulation_args(parser, args)
    return args


def print_pages(args, paged: PagedRun) -> None:
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
    report.row("Most in use at once (peak)", f"{paged.num_pages_peak} of {paged.num_pool_pages}, "
                                             f"first at step {paged.peak_step}")
    report.row("Handed out again after a free", paged.num_pages_reused)
    report.row("Requests preempted", f"{paged.num_preempted} (pool full: the newest gave its "
                                     f"pages back and started over)" if paged.num_preempted
               else "0 (the pool never ran out)")
    report.row("Free after the last finished", f"{paged.num_free_after} of {paged.num_pool_pages}")


def print_comparison(args, contiguous: kv.AllocationSummary, paged: PagedRun,
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


def insights(contiguous: kv.AllocationSummary, paged: PagedRun) -> list[str]:
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


def saved_requests(paged: PagedRun) -> list[PagedRequest]:
    """Each request's pages as saved (the figure of the pool reads those held at the peak)."""
    return [PagedRequest(s.name, s.num_tokens, len(s.page_table), s.page_table, a.num_allocated,
                         round(a.waste_pct, 1), step, at_peak)
            for s, a, step, at_peak in zip(paged.sequences, paged.summary.allocations,
                                           paged.finish_steps, paged.page_tables_at_peak)]


def result(args, contiguous: kv.AllocationSummary, paged: PagedRun, mean_paged: int,
           users_contiguous: int, users_paged: int, in_bytes: kv.KVBytes, header) -> PagedKV:
    """What task 4 saves."""
    s = paged.summary
    return PagedKV(
        PagedSimulation(args.lengths, args.max_len, args.total_slots, args.page_size),
        saved_requests(paged),
        PagedFigures(s.num_allocated, s.num_used, round(s.utilization_pct, 1),
                     paged.num_pool_pages, paged.num_pages_peak, paged.num_pages_reused,
                     paged.num_preempted, paged.num_free_after, paged.peak_step),
        Slots(contiguous.num_allocated, contiguous.num_used, round(contiguous.utilization_pct, 1)),
        contiguous.num_allocated - s.num_allocated,
        round(contiguous.num_allocated / s.num_allocated, 1), mean_paged, users_contiguous,
        users_paged, in_bytes.saved(),
        round(users_paged / users_contiguous, 1) if users_contiguous else None, header=header)


def main(argv: list[str] | None = None) -> PagedKV:
    args = parse_args(argv)
    model = cli.resolve_model_or_fail(args.model)
    dtype = settings.resolve_dtype(args.dtype)

    contiguous = kv.allocate_contiguous(args.lengths, args.max_len)
    # The pool: the memory contiguous allocation reserves for ONE request, cut into pages.
    paged = run_paged(args.lengths, args.names, args.page_size,
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
    kv.print_kv_bytes(model, in_bytes)
    report.insight(insights(contiguous, paged))

    record = result(args, contiguous, paged, mean_paged, users_contiguous, users_paged, in_bytes,
                    results.RunHeader.of(model, dtype))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
