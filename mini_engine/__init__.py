"""mini_engine: PagedAttention, continuous batching, prefix caching, chunked prefill,
speculative decoding and an 8-bit KV cache, built from scratch in plain torch.

A request's KV cache lives in fixed-size pages handed out as it grows, the model reads it through
each request's page table, and a scheduler refills a finished request's batch slot at the next
step. It imports torch, safetensors and the standard library, nothing of the lab, so it can be
read, copied and tested on its own. Read it in the order a request travels:

    config.py         EngineConfig: every setting of the engine, checked when it is made
    sequence.py       a request: its tokens, its page table, its state and its clock
    block_manager.py  pages of the KV cache handed to requests, shared by equal prefixes
    scheduler.py      who runs this step, and how many tokens each: one token budget a step,
                      prompts cut into chunks, continuous or static batching, preemption
    proposer.py       speculative decoding's guesser: n-gram lookup in a request's own tokens
    model.py          the Llama forward of SmolLM over a paged KV pool per layer (the caller's)
    kv_quant.py       the KV cache in 8 bits: a token's bytes, scales a layer or a token, the
                      pool's write and read
    sampler.py        the next token: greedy, or temperature with a seeded generator; and
                      the verifier: which guesses the model agrees with
    engine.py         add_request / step / run: schedule, run the model, postprocess; the
                      engine owns its KV pool and hands it to the model
    stats.py          what each step did (StepStats), recorded around the step
    profiler.py       where a step's time goes, phase by phase, for a caller who asks
    kernels/          what makes the step fast on a CPU, apart: C that reads the pages in
                      place, the 8-bit cache and the products in C, the forward compiled
                      (EngineConfig.kernels; kernels/__init__.py)

    model = Llama(folder, "bfloat16")
    engine = LLMEngine(model, eos_token_ids(folder), EngineConfig(kv_bytes=128 << 20))
    engine.add_request(prompt_ids, max_tokens=16)
    engine.run()

No vLLM or transformers modelling code runs here: the weights are read from the model folder's
safetensors files and every layer is written out (task 9 proves it token-identical to
transformers' greedy decoding).
"""
from mini_engine.config import EngineConfig
from mini_engine.engine import LLMEngine, StepStats, eos_token_ids
from mini_engine.model import Llama
from mini_engine.profiler import PHASES, StepProfiler
from mini_engine.sequence import Sequence, State

__all__ = ["EngineConfig", "LLMEngine", "Llama", "PHASES", "Sequence", "State", "StepProfiler",
           "StepStats", "eos_token_ids"]
