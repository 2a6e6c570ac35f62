"""KV-cache arithmetic and the data of tasks 3-4: the source's five requests, contiguous
allocation (task 4's blocks are counted against it), token slots in bytes for the model that
runs (and their IN BYTES section, printed through common.report), and the engine's capacity
derived from the model config (task 2 checks it against what vLLM reports). Task 4's own block
allocator lives in task_4_paged_attention.py."""
from __future__ import annotations

from dataclasses import dataclass

from common import report, results
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


MIB = 1024 * 1024


def pool_bytes(request_tokens: list[int], page_size: int, bytes_per_token: int,
               max_model_len: int) -> int:
    """A KV budget that holds every request's pages at once (request_tokens: each request's
    prompt and answer), and at least one request of max_model_len, in whole MiB: no request
    waits or is preempted (tasks 11 and 12 measure steps, not a full pool)."""
    pages = max(sum(cdiv(n, page_size) for n in request_tokens), cdiv(max_model_len, page_size))
    return cdiv(pages * page_size * bytes_per_token, MIB) * MIB


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


def request_names(lengths: list[int]) -> list[str]:
    """The source's names for its own five lengths, else '<n> tokens'."""
    if lengths == [n for _, n in SOURCE_REQUESTS]:
        return [name for name, _ in SOURCE_REQUESTS]
    return [f"{n} tokens" for n in lengths]


@dataclass
class Simulation(results.Record):
    """What tasks 3-4 simulated: their --lengths, --max-len and --total-slots."""
    lengths_tokens: list[int]      # tokens each request really uses
    max_len_slots: int             # slots contiguous allocation reserves per request
    total_slots: int               # token slots of memory for the concurrent-user estimate


@dataclass
class InBytes(results.Record):
    """What tasks 3-4 save of their KVBytes: the model's bytes per token, the lab's budget."""
    kv_bytes_per_token: int
    budget_bytes: int
    budget_token_slots: int
    budget_blocks: int             # the budget in whole vLLM blocks...
    block_size_tokens: int         # ...of this many tokens
    users_in_budget: dict[str, int]


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

    def saved(self) -> InBytes:
        """What tasks 3-4 save of it."""
        return InBytes(self.model_kv.bytes_per_token, self.budget_bytes, self.budget_tokens,
                       self.in_blocks.num_blocks, self.in_blocks.block_size,
                       {label: fit for label, _, fit in self.users})


def kv_bytes(model_kv: ModelKV, budget_bytes: int, block_size: int, max_model_len: int,
             slots: list[tuple[str, int]], users: list[tuple[str, int]]) -> KVBytes:
    """Token slots -> bytes for this model; how many users of each size fit the budget; the
    budget in whole blocks of block_size (what task 2's engine reports)."""
    budget_tokens = budget_bytes // model_kv.bytes_per_token
    return KVBytes(model_kv, budget_bytes, slots,
                   [(label, per_user, budget_tokens // per_user) for label, per_user in users],
                   derive_capacity(model_kv.bytes_per_token, budget_bytes, block_size,
                                   max_model_len))


def print_kv_bytes(model, figures: KVBytes) -> None:
    """Tasks 3-4's IN BYTES section: token slots in bytes for the model that would run, and in
    the lab's KV budget (figures: worked out by kv_bytes above)."""
    model_kv, in_blocks = figures.model_kv, figures.in_blocks
    bpt = model_kv.bytes_per_token
    report.section(f"IN BYTES: the model in {model_kv.dtype}")
    report.row("Model", model.name)
    report.row("  from", model.source)         # what ran, as every report says it
    report.row("  path", model.path)
    report.row("KV bytes per token", f"{bpt:,} B")
    report.note(f"= {model_kv.formula()}", indent=2)
    for label, num_slots in figures.slots:
        report.row(label, f"{num_slots:,} slots = {num_slots * bpt / MIB:,.2f} MiB")
    budget_tokens = figures.budget_tokens
    report.row("KV budget of the lab",
               f"{figures.budget_bytes / MIB:,.0f} MiB = {budget_tokens:,} slots")
    # vLLM hands the budget out in whole blocks, so the engine of task 2 reports fewer tokens:
    # the same derivation task 2 checks against its engine
    report.row("  in whole vLLM blocks", f"{in_blocks.num_blocks:,} x {in_blocks.block_size} = "
                                         f"{in_blocks.num_tokens:,} tokens")
    report.note(blocks_note(budget_tokens, in_blocks), indent=2)
    for label, slots_per_user, fit in figures.users:
        report.row(f"  {label}", f"{fit:,} users ({budget_tokens:,} // {slots_per_user})")


def blocks_note(budget_tokens: int, in_blocks: KVCapacity) -> str:
    """Why the budget in whole blocks holds fewer tokens than its slots: the slots left over
    (none, one, or more) fill no block."""
    left, size, tokens = budget_tokens - in_blocks.num_tokens, in_blocks.block_size, \
        in_blocks.num_tokens
    unit = report.term("block")
    if left == 0:
        return (f"(vLLM allocates the budget one {unit} at a time, {size} tokens each: no slot "
                f"is left over; task 2 checks {tokens:,} against its engine)")
    if left == 1:
        return (f"(vLLM allocates the budget one {unit} at a time, {size} tokens each: the one "
                f"slot left fills no block; task 2 checks {tokens:,} against its engine)")
    return (f"(vLLM allocates the budget one {unit} at a time, {size} tokens each: the "
            f"{left:,} slots left fill no block; task 2 checks {tokens:,} against its engine)")


# --- Tasks 3-4: contiguous pre-allocation (task 4 counts its blocks the same way) ------------
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
