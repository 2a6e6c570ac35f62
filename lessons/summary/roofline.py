"""The roofline of decoding on this machine: why one request is bound by memory bandwidth and a
batch moves toward the compute bound; and the lab's measured steps placed under it (the
summary's ROOFLINE section).

The model is the roofline of Williams, Waterman and Patterson ("Roofline: an insightful visual
performance model for multicore architectures", CACM 52(4), 2009): attainable speed = min(peak
compute, bandwidth x arithmetic intensity). The machine's bandwidth and peak matmul come from
common/machine.py (measured once a run).

Per decode step the engine reads every weight once, whatever the batch, and each request in the
batch does ~2 FLOPs per weight (a multiply and an add). So with B requests a step reads
weight_bytes + B x kv_bytes and computes B x flops_per_token; it cannot take less than either
takes at the machine's measured bandwidth and matmul throughput:

    step_s  = max(bytes_read / bandwidth, B x flops_per_token / flops_per_s)
    tokens/s <= B / step_s

B = 1 gives the single-request (bandwidth) ceiling; B large gives the compute ceiling
flops_per_s / flops_per_token.

Between the ceiling and the step an engine measures sits the kernel floor (common/machine.py:
the model's own matmuls alone on this machine's library). Every measured step then splits into
three rungs (attribute_step): the ceiling, the floor - ceiling gap (the matmul library on these
shapes), and the step - floor gap (everything else the engine does per step: attention,
sampling, scheduling, HTTP).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from common import results
from common.machine import KernelFloor, Machine, ModelCost


@dataclass
class Ceiling(results.Record):
    """The roofline at one batch size: tokens/s and which bound sets it."""
    batch: int
    tokens_per_s: float
    read_s: float
    compute_s: float
    bound: str           # "bandwidth" or "compute"


def ceiling(cost: ModelCost, machine: Machine, batch: int, context: int) -> Ceiling:
    """The roofline at this batch: tokens/s and which bound sets it."""
    read_s = (cost.weight_bytes + batch * context * cost.kv_bytes_per_context_token) \
        / machine.bandwidth_bytes_s
    compute_s = batch * cost.flops_per_token(context) / machine.flops_s[cost.dtype]
    return Ceiling(batch, batch / max(read_s, compute_s), read_s, compute_s,
                   "bandwidth" if read_s >= compute_s else "compute")


def compute_ceiling(cost: ModelCost, machine: Machine, context: int) -> float:
    return machine.flops_s[cost.dtype] / cost.flops_per_token(context)


def ridge_batch(cost: ModelCost, machine: Machine, context: int) -> float:
    """The batch at which reading the weights and computing take equally long."""
    read_s = cost.weight_bytes / machine.bandwidth_bytes_s
    per_request_s = (cost.flops_per_token(context) / machine.flops_s[cost.dtype]
                     - context * cost.kv_bytes_per_context_token / machine.bandwidth_bytes_s)
    return read_s / per_request_s if per_request_s > 0 else float("inf")


@dataclass
class Rung(results.Record):
    """One measured step on three rungs: the physical ceiling, the kernel floor, the step.
    The gaps, in ms and in % of the step (ceiling + both gaps = the step):
      library = floor - ceiling: the matmul library on the model's shapes, below the peak;
      engine  = step - floor:    everything else the engine does per step.
    larger_gap names the larger of the two; engine < 0 means the engine multiplied faster than
    the floor's kernels (it has its own: read the floor as an upper bound)."""
    ceiling_ms: float
    floor_ms: float
    step_ms: float
    library_ms: float
    engine_ms: float
    ceiling_pct: float
    library_pct: float
    engine_pct: float
    larger_gap: str            # "library" or "engine"
    label: str = ""
    users: int = 1


def attribute_step(ceiling_ms: float, floor_ms: float, step_ms: float, label: str = "",
                   users: int = 1) -> Rung:
    """The three rungs of one step (Rung says what each gap is)."""
    library_ms, engine_ms = floor_ms - ceiling_ms, step_ms - floor_ms
    return Rung(ceiling_ms=ceiling_ms, floor_ms=floor_ms, step_ms=step_ms,
                library_ms=library_ms, engine_ms=engine_ms,
                ceiling_pct=100 * ceiling_ms / step_ms, library_pct=100 * library_ms / step_ms,
                engine_pct=100 * engine_ms / step_ms,
                larger_gap="library" if library_ms >= engine_ms else "engine",
                label=label, users=users)


# --- the lab's steps under this machine's roofline (the summary's section) ---------------------
@dataclass(frozen=True)
class MeasuredStep:
    """A decode step the lab measured, as the roofline reads it (summary.py builds these from
    tasks 1, 2 and 6's results)."""
    name: str             # the result it came from
    label: str            # 'HF, 1 request', 'server, 20 users'
    users: int            # requests in the batch
    tokens_per_s: float
    step_ms: float        # time per decode step
    step_from: str        # how step_ms was found: 'time / tokens', 'measured TPOT'
    core_ms: float | None = None   # a server's: its engine core's own step, of step_ms


@dataclass
class OneUser(results.Record):
    tokens_per_s: float
    step_ms: float
    core_ms: float | None = None


@dataclass
class Placed(results.Record):
    """A measured step placed under the ceilings: one request against the bandwidth ceiling, a
    batch against the compute ceiling and the roofline at its own batch size."""
    label: str
    users: int
    tokens_per_s: float
    step_ms: float
    step_from: str
    pct_of_bandwidth_ceiling: float | None = None
    pct_of_compute_ceiling: float | None = None
    roofline_at_users: Ceiling | None = None
    pct_of_roofline_at_users: float | None = None
    one_user: OneUser | None = None      # the same server's 1-user level, beside its batch
    core_ms: float | None = None         # a server's engine core's own step (vLLM's ITL)

    @property
    def is_batch(self) -> bool:
        return self.pct_of_compute_ceiling is not None

    @property
    def pct_of_its_ceiling(self) -> float:
        return self.pct_of_compute_ceiling if self.is_batch else self.pct_of_bandwidth_ceiling


@dataclass
class Placement(results.Record):
    """The roofline of this machine and the lab's steps under it (the summary's section)."""
    bandwidth_gb_s: float
    matmul_gflop_s: dict[str, float]
    threads: int
    dtype: str
    context: int                 # mean context while decoding (tokens)
    num_params: int
    weight_bytes: int
    weight_read_ms: float
    bytes_per_token: int
    flops_per_token: int
    bandwidth_ceiling_tok_s: float
    compute_ceiling_tok_s: float
    ridge_batch: float
    placed: dict[str, Placed] = field(default_factory=dict)
    rungs: list[Rung] = field(default_factory=list)
    kernel_floor: KernelFloor | None = None
    matmul_n: dict[str, int] | None = None
    bandwidth_low_gb_s: float | None = None   # the slowest of the bandwidth's passes


def floor_batches(steps: list[MeasuredStep]) -> list[int]:
    """The batch sizes the measured steps ran: 1 (tasks 1, 2, task 6's one user) and task 6's
    largest level."""
    return sorted({1} | {s.users for s in steps})


def place(steps: list[MeasuredStep], cost: ModelCost, machine: Machine, context: int,
          floor: KernelFloor | None = None) -> Placement:
    """The measured steps placed under this machine's ceilings (every figure from the inputs),
    and, with the kernel floor, each on three rungs (attribute_step). One request is read
    against the bandwidth ceiling; a batch against the compute ceiling and the roofline at its
    batch size, with the same server's 1-user step beside it when one was measured."""
    single = ceiling(cost, machine, 1, context)
    top = compute_ceiling(cost, machine, context)
    placed: dict[str, Placed] = {}
    batched = _batched(steps)
    ones = {s.name: s for s in steps if s.users == 1}
    for s in steps:
        if s.users == 1 and s.name in batched:
            continue     # a batch's own 1-user level goes beside it (one_user)
        p = Placed(s.label, s.users, s.tokens_per_s, s.step_ms, s.step_from, core_ms=s.core_ms)
        if s.users == 1:
            p.pct_of_bandwidth_ceiling = 100 * s.tokens_per_s / single.tokens_per_s
        else:
            at_batch = ceiling(cost, machine, s.users, context)
            p.pct_of_compute_ceiling = 100 * s.tokens_per_s / top
            p.roofline_at_users = at_batch
            p.pct_of_roofline_at_users = 100 * s.tokens_per_s / at_batch.tokens_per_s
            if s.name in ones:
                one = ones[s.name]
                p.one_user = OneUser(one.tokens_per_s, one.step_ms, one.core_ms)
        placed[s.name] = p
    rungs = []
    if floor is not None and floor.covers(cost, {s.users for s in steps}):
        batched = _batched(steps)
        # one request first, then the server's 1 user just before its batch, as the table reads
        for s in sorted(steps, key=lambda s: (s.name in batched, s.users)):
            # the ceiling's step: one read of the weights (+ KV) or the batch's FLOPs at peak
            ceiling_ms = 1000 * s.users / ceiling(cost, machine, s.users, context).tokens_per_s
            label = "server, 1 user" if s.name in batched and s.users == 1 else s.label
            rungs.append(attribute_step(ceiling_ms, 1000 * floor.step_s[s.users], s.step_ms,
                                        label, s.users))
    return Placement(
        bandwidth_gb_s=machine.bandwidth_bytes_s / 1e9,
        matmul_gflop_s={k: v / 1e9 for k, v in machine.flops_s.items()},
        threads=machine.threads, dtype=cost.dtype, context=context,
        num_params=cost.num_params, weight_bytes=cost.weight_bytes,
        weight_read_ms=1000 * cost.weight_bytes / machine.bandwidth_bytes_s,
        bytes_per_token=cost.bytes_per_token(context), flops_per_token=cost.flops_per_token(context),
        bandwidth_ceiling_tok_s=single.tokens_per_s, compute_ceiling_tok_s=top,
        ridge_batch=ridge_batch(cost, machine, context), placed=placed, rungs=rungs,
        kernel_floor=floor, matmul_n=machine.matmul_n,
        bandwidth_low_gb_s=(machine.bandwidth_passes.low / 1e9 if machine.bandwidth_passes
                            else None))


def _batched(steps: list[MeasuredStep]) -> set[str]:
    """Results that measured a batch (more than one request at once)."""
    return {s.name for s in steps if s.users > 1}


# --- task 9's engine, a point on the summary's figure ------------------------------------------
@dataclass
class EnginePoint(results.Record):
    """The lab's own engine on the roofline (task 9, continuous batching): its batch is the
    mean tokens per step."""
    label: str
    batch: float
    tokens_per_s: float
