"""Task 12's two workloads (task_12_speculative_decoding.py measures them), each a fixed number of
tokens an answer (EOS held off), greedy, through the model's chat template:
- copy: "Repeat the following text exactly, word for word:" and a window of a real text the
  machine already has (the GPL-3, common/texts.py), a distinct window for each request; the
  answer copies from its prompt, so the n-gram proposer finds what comes next there.
- chat: the lab's own questions (settings.PROMPT, then load.user_prompts), whose answers copy
  little from their short prompts.
Also the max_model_len that holds a request (common.shape.max_model_len_for caps it at the
model's own) and the KV budget that holds either workload at once with its guesses."""
from __future__ import annotations

from dataclasses import dataclass

from common import cli, kv, load, settings
from common.texts import source_text, templated
from lessons.task_12.record import WorkloadShape

INSTRUCTION = "Repeat the following text exactly, word for word:\n\n"
COPY_WINDOWS = "the copy prompts"   # what is cut from the text (common/texts.py)
MAX_MODEL_LEN = 512     # a copy prompt (about 160 tokens), its answer and its guesses, with room


@dataclass
class Workload:
    copy_prompts: list[list[int]]       # token ids, as the tokenizer makes them from the texts
    copy_texts: list[str]               # the same prompts as text, for the server
    chat_prompts: list[list[int]]
    chat_texts: list[str]
    source: str                         # the copy prompts' text: its path

    def prompts(self, name: str) -> list[list[int]]:
        return self.copy_prompts if name == "copy" else self.chat_prompts

    def texts(self, name: str) -> list[str]:
        return self.copy_texts if name == "copy" else self.chat_texts

    def shape(self) -> WorkloadShape:
        copy, chat = list(map(len, self.copy_prompts)), list(map(len, self.chat_prompts))
        return WorkloadShape(self.source, min(copy), max(copy), min(chat), max(chat))


def make_workload(tokenizer, num_requests: int, window_tokens: int) -> Workload:
    """num_requests of each: copy prompts, each the next window_tokens tokens of the text (no two
    share a prefix past the instruction), and the lab's prompt and questions as chats."""
    path, text, _ = source_text(COPY_WINDOWS)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if num_requests * window_tokens > len(ids):
        cli.fail(f"--requests {num_requests} copy windows of {window_tokens} tokens are more "
                 f"than the {len(ids):,} tokens of {path}: lower --requests")
    copy_texts = [templated(tokenizer, INSTRUCTION + tokenizer.decode(
        ids[i * window_tokens:(i + 1) * window_tokens])) for i in range(num_requests)]
    chat_texts = [templated(tokenizer, q) for q in
                  [settings.PROMPT, *load.user_prompts(num_requests - 1)]][:num_requests]
    return Workload([tokenizer(t)["input_ids"] for t in copy_texts], copy_texts,
                    [tokenizer(t)["input_ids"] for t in chat_texts], chat_texts, str(path))


def check_fits(workload: Workload, output_tokens: int, max_model_len: int) -> None:
    """Every request and its answer within max_model_len, else one line and exit 2 (a request
    near the end guesses less: the guesses are cut at max_model_len, never refused)."""
    need = max(map(len, workload.copy_prompts + workload.chat_prompts)) + output_tokens
    if need > max_model_len:
        cli.fail(f"a prompt of {need - output_tokens} tokens and --output {output_tokens} "
                 f"exceed max_model_len {max_model_len}: lower --output")


def kv_budget_bytes(workload: Workload, output_tokens: int, max_k: int, page_size: int,
                    bytes_per_token: int, max_model_len: int) -> int:
    """Bytes that hold every request of the larger workload at once, its answer and a step's
    guesses (fp32's bytes per token: the check runs fp32, and bf16 then holds twice), and at
    least one request of max_model_len, in whole MiB: no request waits or is preempted."""
    return max(kv.pool_bytes([len(p) + output_tokens + max_k for p in prompts], page_size,
                             bytes_per_token, max_model_len)
               for prompts in (workload.copy_prompts, workload.chat_prompts))
