"""mini_engine: PagedAttention and continuous batching, built from scratch in plain torch.

A few hundred lines that do on a CPU what vLLM does: a request's KV cache lives in fixed-size
pages handed out as it grows (the page allocator of task 4, running for real), the model reads
the cache through each request's page table, and a scheduler refills a finished request's batch
slot at the next step. Read it in the order a request travels:

    sequence.py       a request: its tokens, its page table, its state and its clock
    block_manager.py  pages of the KV cache handed to requests (common/kv.py's PageAllocator)
    scheduler.py      who runs this step: continuous or static batching, preemption
    model.py          the Llama forward of SmolLM, its KV cache one paged pool per layer
    sampler.py        the next token: greedy, or temperature with a seeded generator
    engine.py         add_request / step / run, with per-request and per-step timing

No vLLM or transformers modelling code runs here: the weights are read from the model folder's
safetensors files and every layer is written out (task 9 proves it token-identical to
transformers' greedy decoding).
"""
from mini_engine.engine import LLMEngine, StepStats
from mini_engine.model import Llama
from mini_engine.sequence import Sequence, State

__all__ = ["LLMEngine", "Llama", "Sequence", "State", "StepStats"]
