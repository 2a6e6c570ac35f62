"""Every setting of the engine in one dataclass (nano-vllm's config.py, vLLM's EngineArgs), checked
once when it is made, so a bad value fails here with its name instead of deep inside a step."""
from __future__ import annotations

from dataclasses import dataclass, fields

from mini_engine.kv_quant import KV_CACHE_DTYPES, KV_SCALES

POLICIES = ("continuous", "static")     # mini_engine/scheduler.py says how they differ


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
    # task 11: the token budget of one step (mini_engine/scheduler.py spends it). 4096 is vLLM's
    # offline default; tasks 9 and 10 never reach it (128 tokens x 16 rows = 2,048).
    max_num_batched_tokens: int = 4096
    enable_chunked_prefill: bool = True # cut a prompt into chunks across steps (vLLM's default);
                                        # off: a prompt waits until its whole remainder fits
    # task 12: speculative decoding (mini_engine/proposer.py guesses, sampler.verify checks).
    # A decoding request verifies up to this many guesses a step besides its last token; 0: off.
    num_speculative_tokens: int = 0
    # the n-gram proposer's range: the longest n from max down to min whose last n tokens occur
    # earlier in the request (vLLM's prompt_lookup_max and prompt_lookup_min; vLLM takes 5 for
    # both when neither is given, the lab the 2-4 of the source's measured run, SPEC.md)
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    # task 13: the decoder layers as one graph of torch.compile (inductor), compiled at the
    # engine's warm_up (mini_engine/compiled.py); off: the eager forward of model.py
    compile_model: bool = False
    # issue 29: one attention call reads at most this many context slots (its requests x their
    # longest context); a larger group attends in several calls (model.split_by_context). A call
    # gathers its keys and values before attending. One call over 16 contexts of 16 to 1,024
    # tokens, each padded to the longest, took 3x as long as calls of two requests each; at
    # nearly equal contexts (900-1,024), where little is padded, 2.5x (a large copy outgrowing
    # the core's cache would explain it; not measured). 2,048 was at most 16 %
    # above the best cap in each case measured, bf16 and fp32 (docs/measurements.md, issue 29);
    # at the lab's short contexts the whole decode batch stays one call.
    attention_call_slots: int = 2048
    # gathered (prefill_in_place off, or where the C cannot run, below), a prefill's queries
    # attend in pieces of at most this many (model.make_batch), each over
    # the context up to its own last position: SDPA computes a whole rectangle and masks what a
    # query must not see, so a prompt whole wastes about half its work, pieces of c about c/2 a
    # row (and the padding of a call's pieces to its longest). On the long-context workload
    # (benchmarks/long_context.py's prompts, 4 tokens out), the steps with prefill spent
    # 2.6-2.7 s attending with prompts whole and 1.4-1.7 s in pieces of 64; 32 as well in one
    # run and 1.8 s in the next, 48 to 256 worse (docs/measurements.md, issue 29).
    prefill_query_chunk: int = 64
    # decode rows attend in one pass of C that reads each request's pages where they are
    # (mini_engine/paged_attention.c), as vLLM's CPU kernel does, instead of a gather and SDPA
    # (and prefill rows too, with prefill_in_place). Where it cannot be built, the model's
    # shapes are past its limits, or the cache is in 8 bits, every row gathers.
    decode_in_place: bool = True
    # with decode_in_place, a prefill's rows (a chunk's, a guess's) attend in the same pass of C,
    # each over its context up to its own position; off, they gather and attend with SDPA in
    # pieces (prefill_query_chunk). At 16 prompts of 11 tokens the C took 0.28x SDPA's time, at
    # prompts of 256 to 512 0.83-1.02x (docs/measurements.md, issue 29).
    prefill_in_place: bool = True
    # task 14: K and V stored in 8 bits (mini_engine/kv_quant.py): "auto" (the model's dtype),
    # "fp8" (e4m3) or "fp8_e5m2", vLLM's names; and where their scales live, "layer" (one a
    # layer, 1.0: vLLM's without calibration) or "token" (one a token, K/V and head)
    kv_cache_dtype: str = "auto"
    kv_scale: str = "token"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            wanted = {"int": int, "str": str, "bool": bool}[f.type]
            # bool is an int in Python: a flag passed as a count (or a count as a flag) is refused
            if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
                raise ValueError(f"EngineConfig.{f.name} must be {f.type}, not {value!r}")
        for name in ("kv_bytes", "page_size", "max_batch", "max_model_len",
                     "attention_call_slots", "prefill_query_chunk"):
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
        if self.compile_model and self.kv_cache_dtype != "auto":
            raise ValueError("EngineConfig.compile_model runs the model's own pools only: the "
                             "8-bit KV cache (kv_cache_dtype) runs eager")
        if self.policy not in POLICIES:
            raise ValueError(f"EngineConfig.policy {self.policy!r} is not one of "
                             f"{', '.join(POLICIES)}")
