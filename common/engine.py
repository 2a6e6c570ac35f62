"""The two engines of tasks 1-2, measured the same way: load, one untimed warm-up, then
measure.PASSES timed generations of MAX_NEW_TOKENS tokens, each from the same seed, the median
one kept (common/measure.py says why the median); and what both save of it (OneRequest).

Both force the full 50 tokens (HF min_new_tokens, vLLM min_tokens: the end-of-sequence token is
not sampled before then), so every run generates the same amount of work and tok/s compare.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from common import kv, measure, results, settings
from common.shape import torch_dtype

WARMUP_TOKENS = 4


@dataclass
class Generation:
    """One timed generation; what tasks 1-2 print and save."""
    engine: str
    text: str
    prompt_tokens: int
    generated_tokens: int
    total_time_s: float
    load_time_s: float
    threads: int
    warmup_excluded: bool = True
    pass_times_s: list[float] = field(default_factory=list)   # every timed pass; total_time_s:
                                                               # the median one

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.total_time_s


def time_text(total_time_s: float, pass_times_s: list[float]) -> str:
    """'2.71 (median of 3 passes: 2.60-2.90; one warm-up excluded)', for tasks 1-2's reports."""
    if len(pass_times_s) < 2:
        return f"{total_time_s:.2f} (one warm-up run excluded)"
    return (f"{total_time_s:.2f} (median of {len(pass_times_s)} passes: {min(pass_times_s):.2f}-"
            f"{max(pass_times_s):.2f}; one warm-up excluded)")


# --- what tasks 1-2 save ---------------------------------------------------------------------
@dataclass
class Sampling(results.Record):
    """What tasks 1-2 asked for: the prompt, how many new tokens, sampled how."""
    prompt: str
    max_new_tokens: int
    temperature: float
    seed: int


@dataclass
class OneRequest(results.Result):
    """Tasks 1-2's result: one timed generation (Generation's figures, tok/s rounded to two
    places) and what was asked for. Task 2 reads task 1's back as its baseline."""
    engine: str
    text: str
    prompt_tokens: int
    generated_tokens: int
    total_time_s: float
    load_time_s: float
    threads: int
    warmup_excluded: bool
    tokens_per_s: float
    settings: Sampling
    pass_times_s: list[float] = field(default_factory=list, kw_only=True)   # every timed pass

    @classmethod
    def of(cls, gen: Generation, sampling: Sampling, header: results.RunHeader, **rest):
        """The result of this generation; rest: the fields a task adds (task 2's comparison)."""
        return cls(gen.engine, gen.text, gen.prompt_tokens, gen.generated_tokens,
                   gen.total_time_s, gen.load_time_s, gen.threads, gen.warmup_excluded,
                   round(gen.tokens_per_s, 2), sampling, header=header,
                   pass_times_s=[round(t, 4) for t in gen.pass_times_s], **rest)

    @property
    def tokens_per_s_spread(self) -> measure.Spread | None:
        """tok/s of every timed pass (None: an older result, one pass)."""
        if not self.pass_times_s:
            return None
        return measure.Spread.of(self.generated_tokens / t for t in self.pass_times_s)

    def tokens_per_s_text(self) -> str:
        """'10.5 tok/s (10.1-10.9)': the median pass and the range of all, for the summary."""
        spread = self.tokens_per_s_spread
        if spread is None or spread.num_passes < 2:
            return f"{self.tokens_per_s:.1f} tok/s"
        return f"{self.tokens_per_s:.1f} tok/s ({spread.low:.1f}-{spread.high:.1f})"


def timed_passes(generate, passes: int) -> tuple[object, float, list[float]]:
    """Run generate() `passes` times: the output of the median pass, its seconds, and every
    pass's seconds."""
    outputs, times = [], []
    for _ in range(passes):
        start = time.perf_counter()
        outputs.append(generate())
        times.append(time.perf_counter() - start)
    median = measure.median_index(times)
    return outputs[median], times[median], times


# --- HuggingFace transformers ----------------------------------------------------------------
def hf_generate(model_path: str, dtype: str, prompt: str = settings.PROMPT,
                max_new_tokens: int = settings.MAX_NEW_TOKENS, seed: int = settings.SEED,
                passes: int = measure.PASSES) -> Generation:
    """The baseline: model.generate() serves one request from start to end."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype))
    model.eval()
    load_time_s = time.perf_counter() - start
    inputs = tokenizer(prompt, return_tensors="pt")
    num_prompt = inputs["input_ids"].shape[1]

    def generate(num_tokens: int):
        return model.generate(**inputs, max_new_tokens=num_tokens, min_new_tokens=num_tokens,
                              do_sample=True, temperature=settings.TEMPERATURE,
                              pad_token_id=tokenizer.eos_token_id)

    def seeded_pass():
        torch.manual_seed(seed)          # every pass samples the same tokens
        return generate(max_new_tokens)

    with torch.inference_mode():
        generate(WARMUP_TOKENS)          # first call pays one-time set-up; not timed
        outputs, total_time_s, times = timed_passes(seeded_pass, passes)
    new_tokens = outputs[0, num_prompt:]
    return Generation("HuggingFace transformers", tokenizer.decode(new_tokens, skip_special_tokens=True),
                      num_prompt, int(new_tokens.shape[0]), total_time_s, load_time_s,
                      torch.get_num_threads(), pass_times_s=times)


# --- vLLM, in-process ------------------------------------------------------------------------
@dataclass
class Engine:
    llm: object
    init_time_s: float
    settings: dict


def start_engine(model_path: str, dtype: str, max_model_len: int = settings.MAX_MODEL_LEN,
                 kv_cache_bytes: int = settings.KV_CACHE_BYTES,
                 block_size: int = settings.BLOCK_SIZE, max_num_seqs: int | None = None) -> Engine:
    """vllm.LLM with the source's CPU settings (see settings.apply_cpu_engine_env), KV blocks of
    settings.BLOCK_SIZE tokens as the lab's server."""
    settings.apply_cpu_engine_env()
    from vllm import LLM

    engine_settings = {"max_model_len": max_model_len, "kv_cache_memory_bytes": kv_cache_bytes,
                       "block_size": block_size, "enforce_eager": True, "dtype": dtype}
    if max_num_seqs:   # the batch cap (vLLM's default is 256)
        engine_settings["max_num_seqs"] = max_num_seqs
    start = time.perf_counter()
    llm = LLM(model=model_path, seed=settings.SEED, **engine_settings)
    return Engine(llm, time.perf_counter() - start, engine_settings)


def engine_capacity(engine: Engine) -> kv.KVCapacity:
    """The KV capacity the engine allocated, read from its scheduler (what vLLM logs as
    'GPU KV cache size: N tokens' and 'Maximum concurrency ...')."""
    vllm_config = engine.llm.llm_engine.vllm_config
    return kv.KVCapacity(vllm_config.cache_config.num_gpu_blocks,
                         vllm_config.cache_config.block_size,
                         vllm_config.model_config.max_model_len)


def vllm_generate(engine: Engine, prompt: str = settings.PROMPT,
                  max_new_tokens: int = settings.MAX_NEW_TOKENS, seed: int = settings.SEED,
                  passes: int = measure.PASSES) -> Generation:
    import torch
    from vllm import SamplingParams

    def params(num_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=settings.TEMPERATURE, max_tokens=num_tokens,
                              min_tokens=num_tokens, seed=seed)

    engine.llm.generate([prompt], params(WARMUP_TOKENS), use_tqdm=False)   # not timed
    outputs, total_time_s, times = timed_passes(
        lambda: engine.llm.generate([prompt], params(max_new_tokens), use_tqdm=False), passes)
    out = outputs[0]
    return Generation("vLLM", out.outputs[0].text, len(out.prompt_token_ids),
                      len(out.outputs[0].token_ids), total_time_s, engine.init_time_s,
                      torch.get_num_threads(), pass_times_s=times)


def vllm_generate_batch(engine: Engine, prompts: list[str],
                        max_new_tokens: int = settings.MAX_NEW_TOKENS) -> tuple[float, int]:
    """Every prompt at once through LLM.generate, which runs them as one batch, as the server's
    concurrent requests: (seconds, tokens generated). Sampled as the server's requests are
    (temperature 0.7, no per-request seed), EOS held off."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=settings.TEMPERATURE, max_tokens=max_new_tokens,
                            min_tokens=max_new_tokens)
    start = time.perf_counter()
    outputs = engine.llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, sum(len(out.outputs[0].token_ids) for out in outputs)
