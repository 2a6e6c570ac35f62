"""The two engines of tasks 1-2, measured the same way: load, one untimed warm-up, then one
timed generation of MAX_NEW_TOKENS tokens; and what both save of it (OneRequest).

Both force the full 50 tokens (HF min_new_tokens, vLLM min_tokens: the end-of-sequence token is
not sampled before then), so every run generates the same amount of work and tok/s compare.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from common import kv, results, settings
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

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.total_time_s


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

    @classmethod
    def of(cls, gen: Generation, sampling: Sampling, header: results.RunHeader, **rest):
        """The result of this generation; rest: the fields a task adds (task 2's comparison)."""
        return cls(gen.engine, gen.text, gen.prompt_tokens, gen.generated_tokens,
                   gen.total_time_s, gen.load_time_s, gen.threads, gen.warmup_excluded,
                   round(gen.tokens_per_s, 2), sampling, header=header, **rest)


# --- HuggingFace transformers ----------------------------------------------------------------
def hf_generate(model_path: str, dtype: str, prompt: str = settings.PROMPT,
                max_new_tokens: int = settings.MAX_NEW_TOKENS, seed: int = settings.SEED) -> Generation:
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

    with torch.inference_mode():
        generate(WARMUP_TOKENS)          # first call pays one-time set-up; not timed
        torch.manual_seed(seed)
        start = time.perf_counter()
        outputs = generate(max_new_tokens)
        total_time_s = time.perf_counter() - start
    new_tokens = outputs[0, num_prompt:]
    return Generation("HuggingFace transformers", tokenizer.decode(new_tokens, skip_special_tokens=True),
                      num_prompt, int(new_tokens.shape[0]), total_time_s, load_time_s,
                      torch.get_num_threads())


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
                  max_new_tokens: int = settings.MAX_NEW_TOKENS, seed: int = settings.SEED) -> Generation:
    import torch
    from vllm import SamplingParams

    def params(num_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=settings.TEMPERATURE, max_tokens=num_tokens,
                              min_tokens=num_tokens, seed=seed)

    engine.llm.generate([prompt], params(WARMUP_TOKENS), use_tqdm=False)   # not timed
    start = time.perf_counter()
    outputs = engine.llm.generate([prompt], params(max_new_tokens), use_tqdm=False)
    total_time_s = time.perf_counter() - start
    out = outputs[0]
    return Generation("vLLM", out.outputs[0].text, len(out.prompt_token_ids),
                      len(out.outputs[0].token_ids), total_time_s, engine.init_time_s,
                      torch.get_num_threads())


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
