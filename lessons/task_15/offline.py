"""Each server's own engine with no server in front, in a fresh process of its own (so neither
its memory nor its threads are the parent's): the same requests as the server's levels, all
at once, EOS held off, sampled as they are (temperature 0.7).

    python -m lessons.task_15.offline --way vLLM|mini_engine|transformers --model PATH
        --dtype D --users 1,20 --tokens 50 --passes 3 [--kernels c]

    vLLM           LLM.generate, the lab's settings (common/engine.py)
    mini_engine    LLMEngine.run, the settings and kernels its server runs with
    transformers   generate_batch, the continuous batching `transformers serve` runs (it
                   starts its batching thread at every call: part of the first token's time)

After one untimed run, the user counts take turns, --passes times; each pass runs the requests
twice, for one token (its time: the first token's, the prompts' prefill) and for all of them,
so the step that makes each later token is their difference over the tokens after the first.
Answers once (common/measure.py: answer): {"startup_s": s, "tokens_per_s": {"1": [a pass
each], "20": [...]}, "first_token_s": {...}, "step_s": {...}}.
"""
from __future__ import annotations

import argparse
import time

from common import load, measure, settings
from lessons.task_15.servers import Settings, transformers_blocks


def vllm_way(path: str, dtype: str, s: Settings):
    from common import engine

    llm = engine.start_engine(path, dtype, s.max_model_len, s.kv_cache_bytes, s.block_size,
                              s.max_num_seqs)
    return lambda prompts, tokens: engine.vllm_generate_batch(llm, prompts, tokens)[1]


def mini_engine_way(path: str, dtype: str, s: Settings, kernels: str = "c"):
    from transformers import AutoTokenizer

    from mini_engine import EngineConfig, LLMEngine, Llama, eos_token_ids

    tokenizer = AutoTokenizer.from_pretrained(path)
    llm = LLMEngine(Llama(path, dtype), eos_token_ids(path), EngineConfig(
        kv_bytes=s.kv_cache_bytes, page_size=s.block_size, max_batch=s.max_num_seqs,
        max_model_len=s.max_model_len, seed=settings.SEED,
        enable_prefix_caching=s.prefix_caching, kernels=kernels))
    llm.warm_up()                      # as its server does ("compiled": the graphs made here)

    def run(prompts: list[str], tokens: int) -> int:
        seqs = [llm.add_request(tokenizer.encode(p), tokens, tokens, settings.TEMPERATURE)
                for p in prompts]
        llm.run()
        llm.sequences.clear()            # a run's requests only
        llm.steps.clear()
        return sum(len(seq.output_ids) for seq in seqs)
    return run


def transformers_way(path: str, dtype: str, s: Settings):
    import torch
    from transformers import (AutoModelForCausalLM, AutoTokenizer, ContinuousBatchingConfig,
                              GenerationConfig)

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    pool = ContinuousBatchingConfig(page_size=s.block_size, num_blocks=transformers_blocks(
        path, dtype, s), max_requests_per_batch=s.max_num_seqs)

    def run(prompts: list[str], tokens: int) -> int:
        config = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=True,
                                  temperature=settings.TEMPERATURE)
        # one manager kept, as the server keeps one; no warm-up, which captures CUDA graphs
        # and here only doubled each call's time (docs/server.md)
        out = model.generate_batch([tokenizer.encode(p) for p in prompts], config, pool,
                                   persistent_manager=True, warmup=False)
        return sum(len(o.generated_tokens) for o in out.values())
    return run


WAYS = {"vLLM": vllm_way, "mini_engine": mini_engine_way, "transformers": transformers_way}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--way", choices=WAYS, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--users", required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--passes", type=int, required=True)
    parser.add_argument("--kernels", default="c", help="mini_engine's, as its server's")
    args = parser.parse_args()
    settings.apply_cpu_engine_env()            # before vLLM (and torch) is imported
    users = [int(n) for n in args.users.split(",")]
    prompts = load.user_prompts(max(users))
    start = time.perf_counter()
    way = WAYS[args.way]
    run = (way(args.model, args.dtype, Settings(), args.kernels) if args.way == "mini_engine"
           else way(args.model, args.dtype, Settings()))
    startup_s = time.perf_counter() - start
    run(prompts[:1], 4)                        # untimed: the first run pays for what start left
    found = {what: {str(n): [] for n in users} for what in ("tokens_per_s", "first_token_s",
                                                           "step_s")}
    for _ in range(args.passes):
        for n in users:
            t = time.perf_counter()
            run(prompts[:n], 1)
            first_s = time.perf_counter() - t
            t = time.perf_counter()
            num_tokens = run(prompts[:n], args.tokens)
            all_s = time.perf_counter() - t
            found["tokens_per_s"][str(n)].append(num_tokens / all_s)
            found["first_token_s"][str(n)].append(first_s)
            found["step_s"][str(n)].append((all_s - first_s) / max(1, args.tokens - 1))
    measure.answer({"startup_s": startup_s, **found})


if __name__ == "__main__":
    main()
