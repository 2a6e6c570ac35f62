"""Task 9's workload (task_9_build_your_own_engine.py runs it through every engine; task 13 runs
the same one): the lab's user prompts, each with an output length drawn at random, seeded."""
from __future__ import annotations

import random
from dataclasses import dataclass

from common import load, settings


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    num_output: int


def make_workload(tokenizer, num_requests: int, mean_output: int, seed: int,
                  max_model_len: int = settings.MAX_MODEL_LEN) -> list[Request]:
    """The lab's user prompts; output lengths drawn from an exponential distribution (the shape
    of Anyscale's continuous-batching benchmark), at least 1, capped so prompt + output fit."""
    rng = random.Random(seed)
    workload = []
    for prompt in load.user_prompts(num_requests):
        ids = tokenizer(prompt)["input_ids"]
        drawn = max(1, round(rng.expovariate(1 / mean_output)))
        workload.append(Request(ids, min(drawn, max_model_len - len(ids))))
    return workload
