"""A request's text, made token by token (vLLM's incremental detokenizer, the output
processor's half of a request).

A token is not a piece of text. One character may take several tokens (an emoji, a Korean
syllable, each of its UTF-8 bytes a token of its own), and a token's text may depend on the one
before it (a word's leading space). So the text is never the sum of each token decoded alone:
it is the decode of a window of tokens, and what that decode adds over the same window without
the newest tokens. While the newest tokens end in the middle of a character the decode ends in
U+FFFD, and the new text waits for the rest of it: no client sees a broken character.

Stop strings end a request where they occur, and are not part of its text (OpenAI's `stop`),
once it has made min_tokens tokens (vLLM's rule: the text of its first min_tokens tokens is not
searched). While a request may still be growing into one, the last len(stop) - 1 characters are
held back, so a client never sees the start of a stop string that later turns out to be one.
"""
from __future__ import annotations

REPLACEMENT = "\ufffd"       # what decoding gives for the bytes of a character not complete
PROMPT_CONTEXT = 5           # prompt tokens decoded before the first new one (vLLM's choice)


class Detokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str] = (),
                 min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-PROMPT_CONTEXT:])
        # ids[prefix:read] was decoded already; ids[read:] are the tokens not yet in the text
        self.prefix = 0
        self.read = len(self.ids)
        self.text = ""          # the request's text so far (a stop string cut off)
        self.num_sent = 0       # characters of it given to the client
        self.stop = [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.stopped = False    # a stop string was found: the request is over
        self.min_tokens, self.num_tokens = min_tokens, 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _add(self, token_id: int) -> None:
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.text += after[len(before):]
            self.prefix, self.read = self.read, len(self.ids)

    def add(self, token_ids: list[int], finished: bool = False) -> str:
        """The new tokens of a step; returns the text the client may have now. finished: the
        engine ended the request, so nothing is held back."""
        start = len(self.text)
        for token_id in token_ids:
            self._add(token_id)
            self.num_tokens += 1
            if self.num_tokens <= self.min_tokens:
                start = len(self.text)        # no stop string is looked for in this text
            elif self.stop and self._cut_at_stop(start):
                break
        done = finished or self.stopped
        end = len(self.text) if done else max(self.num_sent, len(self.text) - self.hold)
        delta, self.num_sent = self.text[self.num_sent:end], end
        return delta

    def _cut_at_stop(self, start: int) -> bool:
        """The text ends at the first stop string found in what this step added (a match may
        begin up to hold characters before it)."""
        begin = max(0, start - self.hold)
        found = [i for i in (self.text.find(s, begin) for s in self.stop) if i >= 0]
        if not found:
            return False
        self.text, self.stopped = self.text[:min(found)], True
        return True
