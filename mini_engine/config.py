"""Every setting of the engine in one dataclass (nano-vllm's config.py, vLLM's EngineArgs), checked
once when it is made, so a bad value fails here with its name instead of deep inside a step."""
from __future__ import annotations

from dataclasses import dataclass, fields

from mini_engine.kv_quant import KV_CACHE_DTYPES, KV_SCALES

POLICIES = ("continuous", "static")     # mini_engine/scheduler.py says how they differ
KERNELS = ("torch", "c", "compiled")    # mini_engine/kernels/__init__.py says what each runs


@dataclass(frozen=True)
class EngineConfig:
    kv_bytes: int                       # KV-cache budget in bytes (vLLM's kv_cache_memory_bytes),
                                        # cut into whole pages by the engine
    page_size: int = 16                 # tokens per KV page (vLLM's block_size)
    max_batch: int = 16                 # requests computed in one step (vLLM's max_num_seqs)
    max_model_len: int = 128            # prompt + output tokens of one request, at most
    policy: str = "continuous"          # "continuous" or "static" batching
    pad_finished: bool = True           # static: a finished request stays in its batch as padding
    seed: int = 0                       # of the sampler's generator (temperature > 0)
    enable_prefix_caching: bool = False # share the KV pages of equal prompt prefixes (task 10)
    max_num_batched_tokens: int = 4096  # tokens one step computes, at most (vLLM's offline default)
    enable_chunked_prefill: bool = True # cut a prompt into chunks across steps (vLLM's default)
    num_speculative_tokens: int = 0     # guesses a decoding request verifies a step; 0: off
    prompt_lookup_max: int = 4          # the n-gram proposer's longest n (vLLM's prompt_lookup_max)
    prompt_lookup_min: int = 2          # and its shortest (vLLM's prompt_lookup_min)
    kv_cache_dtype: str = "auto"        # K and V stored as the model's dtype, "fp8" or "fp8_e5m2"
    kv_scale: str = "token"             # 8-bit scales: one a "layer" (vLLM's), or a "token" and head
    kernels: str = "torch"              # "torch", "c" (mini_engine/kernels/ where it builds) or
                                        # "compiled" (the C and torch.compile's forward)

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            wanted = {"int": int, "str": str, "bool": bool}[f.type]
            # bool is an int in Python: a flag passed as a count (or a count as a flag) is refused
            if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
                raise ValueError(f"EngineConfig.{f.name} must be {f.type}, not {value!r}")
        for name in ("kv_bytes", "page_size", "max_batch", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be at least 1, not "
                                 f"{getattr(self, name)}")
        # every running request takes at least one token a step (a decode, or a padding row):
        # a budget below the cap could not give each one its token (vLLM refuses it too)
        if self.max_num_batched_tokens < self.max_batch:
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens})"
                             f" is smaller than max_batch ({self.max_batch}): a step could not "
                             "give every running request its one token")
        # without chunks a prompt is computed in one step: one of max_model_len must fit
        # (vLLM's rule for --no-enable-chunked-prefill)
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"EngineConfig.max_num_batched_tokens ({self.max_num_batched_tokens})"
                             f" is smaller than max_model_len ({self.max_model_len}) with "
                             "enable_chunked_prefill off: a prompt that long could never be "
                             "scheduled")
        if self.num_speculative_tokens < 0:
            raise ValueError(f"EngineConfig.num_speculative_tokens must be at least 0, not "
                             f"{self.num_speculative_tokens}")
        if self.num_speculative_tokens and not (
                1 <= self.prompt_lookup_min <= self.prompt_lookup_max):
            raise ValueError(f"EngineConfig.prompt_lookup_min ({self.prompt_lookup_min}) and "
                             f"prompt_lookup_max ({self.prompt_lookup_max}) must satisfy 1 <= min"
                             " <= max (vLLM's rule)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES or self.kv_scale not in KV_SCALES:
            raise ValueError(f"EngineConfig.kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                             f"{', '.join(KV_CACHE_DTYPES)}, or kv_scale {self.kv_scale!r} not "
                             f"one of {', '.join(KV_SCALES)}")
        if self.kernels not in KERNELS:
            raise ValueError(f"EngineConfig.kernels {self.kernels!r} is not one of "
                             f"{', '.join(KERNELS)}")
        if self.kernels == "compiled" and self.kv_cache_dtype != "auto":
            raise ValueError("EngineConfig.kernels 'compiled' runs the model's own pools only: "
                             "the 8-bit KV cache (kv_cache_dtype) runs eager")
        if self.policy not in POLICIES:
            raise ValueError(f"EngineConfig.policy {self.policy!r} is not one of "
                             f"{', '.join(POLICIES)}")
