"""Part 3's fresh process: vLLM offline one way, so that neither way's memory or compiled graphs
are the other's. The parent (task_13_compiled_step.py) starts one of these per way, samples its
memory, and reads what it prints (common/measure.py's Child and serve).

    python -m lessons.task_13.vllm_run --model PATH --dtype D --mode eager|compiled
        --requests N --tokens T --max-num-seqs B --workload FILE

eager: the source's settings, the lab's (enforce_eager=True, TORCHDYNAMO_DISABLE=1). compiled:
vLLM's default on a CPU (-O2: torch.compile with inductor at start-up; vllm/platforms/cpu.py),
TORCHDYNAMO_DISABLE unset; everything else the same, the batch cap the parent's (max_num_seqs).
Greedy, EOS held off. At its set-up: one request (the median of three generations), then N at
once (the median of three), said when it is ready. Then a pass of the parent's workload (--workload, a
JSON list of [prompt token ids, tokens to make]: task 9's, as mini_engine runs it) each time the
parent asks, taking turns with mini_engine's passes in the parent's process."""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from common import load, measure, settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--mode", choices=("eager", "compiled"), required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--tokens", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--workload", required=True)
    args = parser.parse_args()
    settings.apply_cpu_engine_env()            # before vLLM (and torch) is imported
    eager = args.mode == "eager"
    if not eager:
        os.environ.pop("TORCHDYNAMO_DISABLE")  # torch.compile reads it when vLLM calls it
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=args.model, seed=settings.SEED, dtype=args.dtype,
              max_model_len=settings.MAX_MODEL_LEN, kv_cache_memory_bytes=settings.KV_CACHE_BYTES,
              block_size=settings.BLOCK_SIZE, enforce_eager=eager, max_num_seqs=args.max_num_seqs)
    startup_s = time.perf_counter() - start
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, min_tokens=args.tokens)
    prompts = load.user_prompts(args.requests)

    def median_of_passes(batch: list, batch_params) -> tuple[float, list]:
        runs = []
        for _ in range(measure.PASSES):
            t = time.perf_counter()
            outputs = llm.generate(batch, batch_params, use_tqdm=False)
            runs.append((time.perf_counter() - t, outputs))
        seconds, outputs = measure.median_pass(runs, lambda run: run[0])
        return sum(len(o.outputs[0].token_ids) for o in outputs) / seconds, outputs

    one_tok_s, _ = median_of_passes(prompts[:1], params)
    batch_tok_s, outputs = median_of_passes(prompts, params)
    workload = json.loads(Path(args.workload).read_text())
    workload_prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in workload]
    workload_params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n)
                       for _, n in workload]

    def workload_pass() -> dict:
        t = time.perf_counter()
        done = llm.generate(workload_prompts, workload_params, use_tqdm=False)
        return {"tokens": sum(len(o.outputs[0].token_ids) for o in done),
                "seconds": time.perf_counter() - t}
    measure.serve(workload_pass, {"enforce_eager": eager, "startup_s": startup_s,
                                "one_tokens_per_s": one_tok_s, "batch_tokens_per_s": batch_tok_s,
                                "texts": [o.outputs[0].text for o in outputs]})


if __name__ == "__main__":
    main()
