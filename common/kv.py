"""KV-cache arithmetic and the data of tasks 3-4: the source's five requests, contiguous
allocation, the page allocator, token slots in bytes for the model that runs, and the engine's
capacity derived from the model config (task 2 checks it against what vLLM reports)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from common.shape import DTYPE_BYTES, ModelShape


@dataclass(frozen=True)
class ModelKV:
    """The shape of one token's KV cache, from the model's shape (common.shape)."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int

    @classmethod
    def of(cls, model_shape: ModelShape, dtype: str) -> "ModelKV":
        return cls(model_shape.num_layers, model_shape.num_kv_heads, model_shape.head_dim, dtype,
                   DTYPE_BYTES[dtype])

    @classmethod
    def from_folder(cls, model_path: str, dtype: str) -> "ModelKV":
        """From the model folder's config.json (no weights read)."""
        return cls.of(ModelShape.from_folder(model_path), dtype)

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head_dim x bytes per value.

        SmolLM-135M in bf16: 2 x 30 x 3 x 64 x 2 = 23,040 B (22.5 KiB) per token.
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def formula(self) -> str:
        return (f"2 (K,V) x {self.num_layers} layers x {self.num_kv_heads} KV heads x "
                f"{self.head_dim} dims x {self.dtype_bytes} B ({self.dtype})")


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVCapacity:
    """How many tokens (and requests of max_model_len) a KV budget holds, in whole blocks."""
    num_blocks: int
    block_size: int
    max_model_len: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        # A request of max_model_len tokens holds cdiv(max_model_len, block_size) whole blocks
        # (vLLM's get_max_concurrency_for_kv_cache_config for one full-attention group).
        return self.num_blocks / cdiv(self.max_model_len, self.block_size)


def derive_capacity(bytes_per_token: int, budget_bytes: int, block_size: int,
                    max_model_len: int) -> KVCapacity:
    """The budget in whole blocks: 128 MiB / (23,040 B x 128 tokens) = 45 blocks in bf16."""
    return KVCapacity(budget_bytes // (bytes_per_token * block_size), block_size, max_model_len)


# --- Tasks 3-4: the source's five requests (name, tokens that request really uses) -----------
SOURCE_REQUESTS = [("Short question", 45), ("Medium paragraph", 128), ("Quick greeting", 23),
                   ("Long document", 256), ("Code snippet", 67)]
MAX_LEN = 512             # slots contiguous allocation reserves per request (the source's)
TOTAL_SLOTS = 10_000      # token slots of memory for the concurrent-user estimate
MIB = 1024 * 1024


def request_names(lengths: list[int]) -> list[str]:
    """The source's names for its own five lengths, else '<n> tokens'."""
    if lengths == [n for _, n in SOURCE_REQUESTS]:
        return [name for name, _ in SOURCE_REQUESTS]
    return [f"{n} tokens" for n in lengths]


@dataclass(frozen=True)
class KVBytes:
    """Tasks 3-4's token slots in bytes for the model that would run, and in the lab's budget."""
    model_kv: ModelKV
    budget_bytes: int
    slots: list[tuple[str, int]]              # (label, token slots), shown in MiB
    users: list[tuple[str, int, int]]         # (label, slots per user, users in the budget)
    in_blocks: "KVCapacity"                   # the budget in whole vLLM blocks

    @property
    def budget_tokens(self) -> int:
        return self.budget_bytes // self.model_kv.bytes_per_token

    def to_dict(self) -> dict:
        return {"kv_bytes_per_token": self.model_kv.bytes_per_token,
                "budget_bytes": self.budget_bytes, "budget_token_slots": self.budget_tokens,
                "budget_blocks": self.in_blocks.num_blocks, "block_size": self.in_blocks.block_size,
                "users_in_budget": {label: fit for label, _, fit in self.users}}


def kv_bytes(model_kv: ModelKV, budget_bytes: int, block_size: int, max_model_len: int,
             slots: list[tuple[str, int]], users: list[tuple[str, int]]) -> KVBytes:
    """Token slots -> bytes for this model; how many users of each size fit the budget; the
    budget in whole blocks of block_size (what task 2's engine reports)."""
    budget_tokens = budget_bytes // model_kv.bytes_per_token
    return KVBytes(model_kv, budget_bytes, slots,
                   [(label, per_user, budget_tokens // per_user) for label, per_user in users],
                   derive_capacity(model_kv.bytes_per_token, budget_bytes, block_size,
                                   max_model_len))


# --- Task 3: contiguous pre-allocation -------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    num_used: int        # token slots the request actually fills
    num_allocated: int   # token slots reserved for it

    @property
    def waste_pct(self) -> float:
        return 100.0 * (self.num_allocated - self.num_used) / self.num_allocated


@dataclass(frozen=True)
class AllocationSummary:
    allocations: list[Allocation]

    @property
    def num_allocated(self) -> int:
        return sum(a.num_allocated for a in self.allocations)

    @property
    def num_used(self) -> int:
        return sum(a.num_used for a in self.allocations)

    @property
    def utilization_pct(self) -> float:
        return 100.0 * self.num_used / self.num_allocated

    @property
    def waste_pct(self) -> float:
        return 100.0 - self.utilization_pct


def allocate_contiguous(lengths: list[int], max_len: int) -> AllocationSummary:
    """Every request reserves max_len slots up front: its final length is unknown."""
    return AllocationSummary([Allocation(n, max_len) for n in lengths])


def users_that_fit(total_slots: int, slots_per_request: int) -> int:
    """Whole requests of slots_per_request that fit in total_slots."""
    return total_slots // slots_per_request


def mean_slots(total: int, num_requests: int) -> int:
    """Mean slots per request in whole slots, rounded down (the source's 519 // 5 = 103)."""
    return total // num_requests


# --- Task 4: paged allocation with a real allocator ------------------------------------------
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
    summary: AllocationSummary
    num_pool_pages: int
    num_pages_peak: int     # most pages in use at once (requests finish at different times)
    num_free_after: int     # pages free once every request finished (all back: == pool size)
    num_pages_reused: int   # pages handed out again after the request that had them finished
    num_preempted: int      # times a request gave its pages back to let the others go on
    finish_steps: list[int]  # decode step at which each request had all its tokens


def run_paged(lengths: list[int], names: list[str], page_size: int, num_pool_pages: int) -> PagedRun:
    """Decode every request at once, one token per request per step, interleaved, so pages are
    handed out as tokens arrive (and a request's pages need not be next to each other). A request
    gives its pages back when it has all its tokens; the free list hands them to the requests
    still growing. A request that finds no free page waits a step; when every request waits (the
    pool is full of unfinished requests), the newest gives all its pages back and starts over
    later, as vLLM's scheduler preempts by recomputation. No request may need more than the pool.
    """
    if max(cdiv(n, page_size) for n in lengths) > num_pool_pages:
        raise OutOfPages(f"a request of {max(lengths)} tokens needs more than the "
                         f"{num_pool_pages} pages of the pool")
    allocator = PageAllocator(num_pool_pages, page_size)
    sequences = [Sequence(name) for name in names]
    finish_steps = [0] * len(sequences)
    handed_out: set[int] = set()
    num_pages_peak = num_reused = num_preempted = step = 0
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
        num_pages_peak = max(num_pages_peak, num_pool_pages - allocator.num_free)
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
    summary = AllocationSummary([Allocation(s.num_tokens, len(s.page_table) * page_size)
                                 for s in sequences])
    return PagedRun(sequences, summary, num_pool_pages, num_pages_peak, allocator.num_free,
                    num_reused, num_preempted, finish_steps)
