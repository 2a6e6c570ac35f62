"""Task 4: PagedAttention - vLLM's solution.

Instead of reserving --max-len slots per request, hand out small blocks of --block-size tokens
as tokens are generated, the way an OS hands out 4 KB memory pages (the paper, PagedAttention,
calls a block a page; vLLM says block). A real block allocator (a free list of block ids) serves
the same five requests as task 3, one token at a time, interleaved as in decoding, from a pool
of the memory contiguous allocation reserves for ONE request; each request's waste is then
bounded by one block, and a request that has all its tokens gives its blocks back for the
others. Prints the blocks per request, what the pool went through (peak, blocks handed out
again), the side-by-side comparison with contiguous allocation, the users that fit, and the
bytes for the model the lab runs. (The code keeps the page_* names the saved record uses.)

    python task_4_paged_attention.py [--lengths 45,128,23,256,67] [--max-len 512]
                                     [--block-size 16] [--total-slots 10000] [--model M]
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from common import cli, figures, kv, results, settings
from lessons.task_4 import FIGURES
from lessons.task_4.record import PagedFigures, PagedKV, PagedRequest, PagedSimulation, Slots
from lessons.task_4.report import print_report

SCRIPT = "task_4_paged_attention"


# --- the block allocator ----------------------------------------------------------------------
class OutOfPages(Exception):
    pass


class PageAllocator:
    """A pool of fixed-size blocks handed out one at a time from a free list (vLLM's
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
            raise OutOfPages(f"all {self.num_pages} blocks are in use")
        return self.free_pages.popleft()

    def free(self, pages: list[int]) -> None:
        self.free_pages.extend(pages)


@dataclass
class Sequence:
    """One request's tokens and its block table (logical block i -> physical block id)."""
    name: str
    num_tokens: int = 0
    page_table: list[int] = field(default_factory=list)

    def append_slot(self, allocator: PageAllocator) -> None:
        """Add one token; take a new block only when the last one is full."""
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
                         f"{num_pool_pages} blocks of the pool")
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


# --- the flags ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    cli.add_kv_simulation_args(parser)
    parser.add_argument("--block-size", "--page-size", dest="page_size", type=cli.positive_int,
                        default=16, help="tokens per block (default 16, vLLM's GPU block size; "
                                         "--page-size: the paper's word)")
    cli.add_model_args(parser)
    args = parser.parse_args(argv)
    args.names = cli.check_kv_simulation_args(parser, args)
    return args


def saved_requests(paged: PagedRun) -> list[PagedRequest]:
    """Each request's blocks as saved (the figure of the pool reads those held at the peak)."""
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
    # The pool: the memory contiguous allocation reserves for ONE request, cut into blocks.
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
               ("In blocks, allocated", paged.summary.num_allocated),
               ("Memory saved", contiguous.num_allocated - paged.summary.num_allocated)],
        users=[(f"Contiguous ({args.max_len} each)", args.max_len),
               (f"In blocks ({mean_paged} each)", mean_paged)])

    print_report(args, model, contiguous, paged, mean_paged, users_contiguous, users_paged,
                 in_bytes)

    record = result(args, contiguous, paged, mean_paged, users_contiguous, users_paged, in_bytes,
                    results.RunHeader.of(model, dtype))
    figures.saved(results.save(SCRIPT, record), record, FIGURES)
    return record


if __name__ == "__main__":
    cli.run(main)
