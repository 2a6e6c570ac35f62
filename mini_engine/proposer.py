"""The guesser of speculative decoding: n-gram prompt lookup (vLLM's `ngram` method, Saxena's
prompt lookup decoding). No draft model: a request's next tokens are guessed from its own tokens.

If the last n tokens (its latest n-gram) occurred earlier in the prompt or the output, the
tokens that followed them then are a good guess for what follows now: an answer that copies a
passage, corrects a text or edits code repeats long runs of its input. The longest n from
prompt_lookup_max down to prompt_lookup_min that has an earlier occurrence wins (a longer match is
more specific), and of its occurrences the earliest, as vLLM 0.27.1 does
(vllm/v1/spec_decode/ngram_proposer.py, _find_longest_matched_ngram_and_propose_tokens;
transformers' PromptLookupCandidateGenerator also takes the first match). Up to k tokens that
followed it are proposed, never past the end of what is known.

A guess costs one query row in the next forward and nothing else: the verifier (sampler.verify)
keeps only what the model itself would have produced. The proposer is deterministic: its "draft
distribution" is all on the token it proposes, which is what the verifier's acceptance rule
assumes.
"""
from __future__ import annotations


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, token_ids: list[int], max_guesses: int | None = None) -> list[int]:
        """Up to min(k, max_guesses) tokens that followed the earliest earlier occurrence of the
        longest suffix n-gram (n in [min_n, max_n]); [] when none occurs."""
        k = self.k if max_guesses is None else min(self.k, max_guesses)
        total = len(token_ids)
        if k <= 0 or total < self.min_n:
            return []
        # Every earlier position j holding the last token ends a candidate occurrence; it
        # matches the suffix for as many tokens as agree going back from j (capped at max_n).
        # One pass over those j is the same as trying each n from max_n down to min_n, each
        # from the start, and cheap: few positions hold the last token.
        last = token_ids[-1]
        best_n, best_end = 0, -1
        for j in range(total - 1):
            if token_ids[j] != last:
                continue
            n = 1
            while n < self.max_n and n <= j and token_ids[j - n] == token_ids[total - 1 - n]:
                n += 1
            if n > best_n:          # strictly longer: an equal one later is not earlier
                best_n, best_end = n, j
                if n == self.max_n:
                    break           # nothing longer counts, and this is the earliest of max_n
        if best_n < self.min_n:
            return []
        return token_ids[best_end + 1:best_end + 1 + k]
