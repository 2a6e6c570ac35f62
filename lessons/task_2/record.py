"""What task 2 saves: vLLM's one generation, the comparison with HuggingFace's, and the KV
capacity the engine allocated beside the one derived from the model config
(results/task_2_vllm_inference.json); and its row in the summary's table."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import engine, kv, measure, results


@dataclass
class EngineSettings(engine.Sampling):
    """The sampling of task 1, and vllm.LLM's arguments (common.engine.start_engine), by their
    names in vLLM: max_model_len and block_size in tokens."""
    max_model_len: int
    kv_cache_memory_bytes: int
    block_size: int
    enforce_eager: bool
    dtype: str


@dataclass
class Baseline(results.Record):
    """HuggingFace's one request, to compare with: task 1's saved result, or measured here."""
    source: str
    tokens_per_s: float
    total_time_s: float
    pass_tokens_per_s: list[float] = field(default_factory=list)   # every timed pass's

    @property
    def spread(self) -> measure.Spread | None:
        return measure.Spread.of(self.pass_tokens_per_s) if self.pass_tokens_per_s else None


@dataclass
class Capacity(results.Record):
    """A KV capacity (common.kv.KVCapacity): the engine's, read, or the one derived."""
    num_blocks: int
    block_size: int                         # tokens a block
    num_tokens: int
    max_concurrency: float                  # requests of max_model_len tokens at once
    kv_bytes_per_token: int | None = None   # the derived one's: from the model config

    @classmethod
    def of(cls, capacity: kv.KVCapacity, kv_bytes_per_token: int | None = None) -> "Capacity":
        return cls(capacity.num_blocks, capacity.block_size, capacity.num_tokens,
                   capacity.max_concurrency, kv_bytes_per_token)


@dataclass
class VLLMInference(engine.OneRequest):
    settings: EngineSettings
    baseline: Baseline
    speedup: float                          # vLLM's tok/s over HuggingFace's
    kv_capacity_engine: Capacity
    kv_capacity_derived: Capacity
    kv_capacity_agree: bool


def summary_row(res: VLLMInference) -> str:
    if res.tokens_per_s_spread is None:                      # one pass: an older result
        return f"{res.tokens_per_s:.1f} tok/s ({res.speedup:.1f}x)"
    return f"{res.tokens_per_s_text()}, {res.speedup:.1f}x"
