"""Task 10's workloads (task_10_prefix_caching.py measures them): the chat workload, one shared
system prompt (a real instruction text, through the model's chat template) before each of the
lab's distinct user questions; and its control, the same prompts with each one's tokens shuffled,
so that the same tokens are computed and no full page is ever shared. Also the max_model_len that
holds them."""
from __future__ import annotations

import random
from dataclasses import dataclass

from common import cli, load, settings
from lessons.task_10.record import WorkloadShape

# A real instruction text, a teaching assistant's system prompt (132 tokens with SmolLM's
# tokenizer); --system-tokens keeps its first N tokens.
SYSTEM_TEXT = (
    "You are a patient teaching assistant for a course on machine learning systems. Answer the "
    "student's question in two or three short sentences of plain English. Define any technical "
    "term the first time you use it, prefer a concrete example to an abstract one, and say plainly "
    "when you are not sure. Do not use lists, tables or code unless the student asks for them. If "
    "the question rests on a mistaken idea, correct it gently before you answer. When numbers "
    "help, give one rough figure with its unit rather than a range of guesses. Keep the tone "
    "friendly and direct, and end with one sentence that connects the answer to how language "
    "models are served in practice.")
LONG_MAX_MODEL_LEN = 256    # when the lab's 128 cannot hold system prompt + question + answer


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]            # token ids, as the tokenizer makes them from texts
    texts: list[str]                    # the same prompts as text, for the server
    shared_tokens: int                  # tokens every prompt starts with

    def shape(self) -> WorkloadShape:
        """Its prompts counted, as the record saves them."""
        lengths = list(map(len, self.prompts))
        return WorkloadShape(self.shared_tokens, sum(lengths), min(lengths), max(lengths))


def common_prefix(prompts: list[list[int]]) -> int:
    n = 0
    while all(len(p) > n and p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def chat_workload(tokenizer, num_requests: int, system_tokens: int) -> Workload:
    """The system prompt's first system_tokens tokens, then each of the lab's user questions,
    through the model's chat template."""
    ids = tokenizer(SYSTEM_TEXT, add_special_tokens=False)["input_ids"][:system_tokens]
    system = tokenizer.decode(ids)
    texts = [tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        add_generation_prompt=True, tokenize=False) for question in load.user_prompts(num_requests)]
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    return Workload("chat", prompts, texts, common_prefix(prompts) if num_requests > 1 else 0)


def control_workload(chat: Workload, page_size: int, seed: int) -> Workload:
    """The same prompts, each one's tokens shuffled: the same lengths and the same tokens to
    compute, and no two prompts sharing their first page, so no full page is ever shared."""
    rng = random.Random(seed)
    while True:
        prompts = [rng.sample(p, len(p)) for p in chat.prompts]
        if len({tuple(p[:page_size]) for p in prompts}) == len(prompts):
            return Workload("control", prompts, [], common_prefix(prompts))


def choose_max_model_len(workload: Workload, output: int) -> int:
    """The lab's 128 when the longest prompt and its answer fit, else 256 (vLLM refuses a prompt
    that cannot fit; mini_engine the same)."""
    need = max(map(len, workload.prompts)) + output
    if need > LONG_MAX_MODEL_LEN:
        cli.fail(f"the longest prompt ({need - output} tokens) and --output {output} exceed "
                 f"max_model_len {LONG_MAX_MODEL_LEN}: lower --system-tokens or --output")
    return settings.MAX_MODEL_LEN if need <= settings.MAX_MODEL_LEN else LONG_MAX_MODEL_LEN
