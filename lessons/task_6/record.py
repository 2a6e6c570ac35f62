"""Task 6's record: every level's median pass and the spread of its passes, one request alone
measured two ways (Alone: the 1-user level against the sequential requests, twins) and the
baseline the scaling factor divides by; how long the sequential requests waited in line for
their first token; the summary's row."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from common import load, measure, results


@dataclass
class Alone(results.Record):
    """One request with the server to itself, measured two ways in one run: the 1-user level's
    passes and the sequential requests (each of them alone too). Tokens/s per request."""
    level: measure.Spread                    # the 1-user level, a value per pass
    sequential: measure.Spread | None        # each request sent one after another
    used: str                                # which one the scaling factor divides by
    tokens_per_s: float                      # its median
    latency_s: float | None                  # its median end-to-end latency
    tpot_s: float | None                     # its time per output token
    engine_itl_s: float | None = None        # the engine core's own, from /metrics

    @property
    def agree(self) -> bool:
        """Twins: their medians within measure.AGREE_WITHIN (not their ranges touching)."""
        return self.sequential is None or self.level.agrees(self.sequential)


LEVEL, SEQUENTIAL = "the 1-user level", "the sequential requests"


def alone_of(one_user: list[load.LoadLevel], sequential: load.LoadLevel | None) -> Alone:
    """The two figures of one request alone, and the one the scaling divides by: the 1-user
    level where they agree (the source's baseline); where they disagree, the one of more
    passes, the sequential requests (20 against 3), whichever way that moves the factor."""
    level = measure.Spread.of(lv.tokens_per_s for lv in one_user)
    median_pass = measure.median_pass(one_user, lambda lv: lv.tokens_per_s)
    alone = Alone(level, None, LEVEL, level.median, median_pass.mean_latency_s,
                  median_pass.mean_tpot_s, median_pass.engine_itl_s)
    if sequential is not None and len(sequential.ok) >= 2:
        alone.sequential = measure.Spread.of(r.output_tokens / r.latency_s for r in sequential.ok)
        if not alone.agree and alone.sequential.num_passes > level.num_passes:
            alone.used, alone.tokens_per_s = SEQUENTIAL, alone.sequential.median
            alone.latency_s = statistics.median(r.latency_s for r in sequential.ok)
            alone.tpot_s = statistics.median(r.tpot_s for r in sequential.ok)
            alone.engine_itl_s = sequential.engine_itl_s
    return alone


def in_line_ttft_s(sequential: load.LoadLevel) -> float | None:
    """The mean time to first token of requests sent one after another, counted from the first
    send (the k-th waited in line for the k - 1 before it), as measured: each request's send
    time and its own time to first token. None for a level read back (its requests are not
    saved) or one of which no request succeeded."""
    if not sequential.ok:
        return None
    first_send = min(r.start_s for r in sequential.requests)
    return statistics.fmean(r.start_s - first_send + r.ttft_s for r in sequential.ok)


def computed_in_line_ttft_s(num_users: int, alone_s: float, alone_ttft_s: float) -> float:
    """The same, computed where the sequential requests were not measured (--no-sequential):
    each of num_users requests taking what one request alone took, the k-th waits for the k - 1
    before it, (n - 1) / 2 of them on average."""
    return (num_users - 1) / 2 * alone_s + alone_ttft_s


def num_failed_of(levels: list[load.LoadLevel], sequential: load.LoadLevel | None) -> int:
    return sum(lv.num_failed for lv in levels) + (sequential.num_failed if sequential else 0)


def scaling_range(peak: measure.Spread, alone: Alone) -> tuple[float, float]:
    """The factor from the ends of the two spreads: the slowest peak pass over the fastest
    baseline, the fastest over the slowest."""
    base = alone.sequential if alone.used == SEQUENTIAL else alone.level
    return peak.low / base.high, peak.high / base.low


@dataclass
class MultiUserLoad(results.Result):
    """Task 6's result: every level as it was measured (common.load.LoadLevel), the server it
    ran against and the load's settings."""
    base_url: str
    server_state: str                   # started, reused, restarted or external (--base-url)
    users_per_level: list[int]          # --users, in the order the levels ran
    max_tokens: int                     # new tokens per request
    temperature: float
    levels: list[load.LoadLevel]
    scaling_factor: float               # peak tokens/s over the first level's (0: it made none)
    server_config: str | None = None    # the lab's server's settings (None: --base-url)
    sequential: load.LoadLevel | None = None   # the largest group one after another
    num_passes: int = 1                 # passes of every level, taking turns
    spreads: list[measure.Spread] = field(default_factory=list)   # tokens/s, a level's passes
    alone: Alone | None = None          # one request alone, two ways (a 1-user first level)
    scaling_range: tuple[float, float] | None = None   # the factor from the spreads' ends
    # the sequential requests' mean time to first token from the first send (in_line_ttft_s;
    # None: not measured)
    sequential_in_line_ttft_s: float | None = None


def summary_row(m: MultiUserLoad) -> str:
    measured = [lv for lv in m.levels if lv.tokens_per_s]
    if not measured:
        return "no level made a token"
    top = max(measured, key=lambda lv: lv.tokens_per_s)
    if len(m.spreads) != len(m.levels) or m.num_passes < 2:
        return f"{top.num_users} users {top.tokens_per_s:.1f} tok/s ({m.scaling_factor:.1f}x)"
    spread = m.spreads[m.levels.index(top)]
    return (f"{top.num_users} users {top.tokens_per_s:.1f} tok/s ({spread.low:.1f}-"
            f"{spread.high:.1f}), {m.scaling_factor:.1f}x")
