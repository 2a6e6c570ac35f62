"""Task 11's workload (task_11_chunked_prefill.py measures it): a few short chat requests (the
lab's questions, through the model's chat template) that stream their answers, and long-document
requests ("Summarise: " and a window of a real text the machine already has, the GPL-3 from
/usr/share/common-licenses) that arrive while the chats decode. Every answer is a fixed number
of tokens (EOS held off). Also the KV budget that holds the whole workload at once."""
from __future__ import annotations

from dataclasses import dataclass

from common import cli, kv, load, settings
from common.texts import source_text, templated
from lessons.task_11.record import WorkloadShape

INSTRUCTION = "Summarise: "
LONG_DOCS = "the long documents"    # what is cut from the text (common/texts.py)
MAX_MODEL_LEN = 2048    # holds a long document; vLLM's server budget on CPU (--no-enable-chunked-
                        # prefill needs a budget of at least max_model_len: 2048 is both)


@dataclass
class Workload:
    chat_prompts: list[list[int]]       # token ids, as the tokenizer makes them from the texts
    chat_texts: list[str]               # the same prompts as text, for the server
    long_prompts: list[list[int]]
    long_texts: list[str]
    source: str                         # the long documents' text: its path
    num_source_tokens: int              # tokens of the whole text (whitespace squeezed)

    def shape(self) -> WorkloadShape:
        chats, longs = list(map(len, self.chat_prompts)), list(map(len, self.long_prompts))
        return WorkloadShape(self.source, self.num_source_tokens, min(chats), max(chats),
                             min(longs), max(longs), sum(longs))

    @property
    def prompts(self) -> list[list[int]]:
        """Every prompt in the order the engine gets them: the chats, then the documents."""
        return self.chat_prompts + self.long_prompts


def make_workload(tokenizer, num_chats: int, num_long: int, long_tokens: int) -> Workload:
    """The lab's prompt and questions as chats; num_long documents, each the next long_tokens
    tokens of the text (distinct windows: no two share a prefix past the chat template)."""
    path, text, _ = source_text(LONG_DOCS)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if num_long * long_tokens > len(ids):
        cli.fail(f"--long-docs {num_long} x --long-tokens {long_tokens} is more than the "
                 f"{len(ids):,} tokens of {path}: lower one")
    chat_texts = [templated(tokenizer, q)
                  for q in [settings.PROMPT, *load.user_prompts(num_chats - 1)]][:num_chats]
    long_texts = [templated(tokenizer, INSTRUCTION + tokenizer.decode(
        ids[i * long_tokens:(i + 1) * long_tokens])) for i in range(num_long)]
    return Workload([tokenizer(t)["input_ids"] for t in chat_texts], chat_texts,
                    [tokenizer(t)["input_ids"] for t in long_texts], long_texts, str(path),
                    len(ids))


def check_fits(workload: Workload, chat_output: int, long_output: int, max_model_len: int
               ) -> None:
    """Every request within max_model_len, else one line and exit 2."""
    need = max(map(len, workload.long_prompts)) + long_output
    if need > max_model_len:
        cli.fail(f"a long document of {need - long_output} tokens and --long-output {long_output}"
                 f" exceed max_model_len {max_model_len}: lower --long-tokens")
    need = max(map(len, workload.chat_prompts)) + chat_output
    if need > max_model_len:
        cli.fail(f"--chat-output {chat_output} does not fit max_model_len {max_model_len}")


def kv_budget_bytes(workload: Workload, chat_output: int, long_output: int, page_size: int,
                    bytes_per_token: int, max_model_len: int) -> int:
    """Bytes that hold every request's pages at once (fp32's bytes per token: the check runs
    fp32, and bf16 then holds twice), and at least one request of max_model_len, in whole MiB."""
    tokens = [len(p) + chat_output for p in workload.chat_prompts] + \
             [len(p) + long_output for p in workload.long_prompts]
    return kv.pool_bytes(tokens, page_size, bytes_per_token, max_model_len)
