"""Task 7's record: each config, its server and KV cache as the engine reported them, the load's
median pass and the spread of its passes; the summary's row, which calls two configs apart only
when their spreads do not overlap."""
from __future__ import annotations

from dataclasses import dataclass

from common import load, measure, results


@dataclass
class TuningConfig(results.Record):
    label: str
    max_model_len: int                 # tokens a request may hold: its prompt + new tokens
    max_num_seqs: int                  # requests one engine step may serve


@dataclass
class ConfigRun(results.Record):
    """One config's run: its server, its KV cache and batch as the engine reported them on
    /metrics, and the load it served (common.load.LoadLevel, as measured)."""
    config: TuningConfig
    server_state: str                  # started, reused or restarted for this config
    kv_max_concurrency: float          # requests of max_model_len the KV cache holds at once
    level: load.LoadLevel
    startup_s: float | None = None     # None: the server was reused, not started
    num_kv_blocks: int | None = None   # None: an engine that does not export its block count
    kv_block_size_tokens: int | None = None
    peak_num_requests_running: int = 0   # the most seen running / waiting during the passes
    peak_num_requests_waiting: int = 0
    num_metrics_samples: int = 0       # reads of /metrics during the passes
    # tokens/s of every pass (level is the median pass, whole); None: a record without passes
    spread: measure.Spread | None = None
    warmup_s: float | None = None      # the warm-up request before the passes, not counted

    @property
    def label(self) -> str:
        return self.config.label


@dataclass
class Tuning(results.Result):
    """Task 7's result: the same load on each config, in the order they ran."""
    num_requests: int                  # concurrent requests per config
    max_tokens: int                    # new tokens per request
    kv_cache_memory_bytes: int         # the KV cache of every config
    configs: list[ConfigRun]


def is_compared(x: ConfigRun, y: ConfigRun) -> bool:
    """Both measured in passes: their spreads can tell them apart, or not."""
    return all(r.spread is not None and r.spread.num_passes > 1 for r in (x, y))


def pair_row(x: ConfigRun, y: ConfigRun) -> str:
    """'A, B not told apart' (the spreads overlap) or 'B above A' / 'B below A'."""
    nx, ny = x.label[0], y.label[0]
    if x.spread.overlaps(y.spread):
        return f"{nx}, {ny} not told apart"
    return f"{ny} {'above' if y.spread.median > x.spread.median else 'below'} {nx}"


def summary_row(t: Tuning) -> str:
    """'A 72.0 / B 74.0 / C 60.0 tok/s; A, B not told apart; C below B': A against B and B
    against C by their spreads; a record of one pass says so, one without spreads is plain."""
    row = " / ".join(f"{c.label[0]} {c.level.tokens_per_s:.1f}" for c in t.configs) + " tok/s"
    if any(c.spread is None for c in t.configs):
        return row
    if len(t.configs) != 3 or not all(is_compared(x, y) for x, y in zip(t.configs,
                                                                        t.configs[1:])):
        return row + " (1 pass: not compared)"
    a, b, c = t.configs
    return f"{row}; {pair_row(a, b)}; {pair_row(b, c)}"
