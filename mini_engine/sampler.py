"""The next token of every request from its logits: greedy, or temperature with a seeded
generator (so a rerun samples the same tokens). With speculative decoding, also the verifier:
which of a request's guesses the model agrees with (verify)."""
from __future__ import annotations

import torch


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, the first where several are equal (torch's rule and numpy's alike),
    through numpy, several times faster than torch's over a vocabulary (docs/measurements.md)."""
    return torch.from_numpy(logits.numpy().argmax(axis=-1))


class Sampler:
    def __init__(self, eos_ids: list[int], seed: int = 0):
        self.eos_ids = eos_ids
        self.generator = torch.Generator().manual_seed(seed)

    def _block_eos(self, logits: torch.Tensor, eos_allowed: list[bool]) -> None:
        """Where eos_allowed is False the end-of-sequence tokens cannot be picked (min_tokens;
        transformers' min_new_tokens does the same)."""
        blocked = [i for i, ok in enumerate(eos_allowed) if not ok]
        if blocked and self.eos_ids:
            logits[torch.tensor(blocked)[:, None], torch.tensor(self.eos_ids)] = float("-inf")

    def _draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of probs (R, V) (each row summing to anything positive): one uniform
        draw per row through the cumulative distribution (inverse transform sampling): exact, and
        far faster than torch.multinomial, which draws many random numbers a row."""
        cdf = probs.cumsum(dim=-1)
        u = torch.rand(len(probs), 1, generator=self.generator) * cdf[:, -1:]
        return torch.searchsorted(cdf, u).squeeze(1).clamp(max=cdf.shape[1] - 1)

    def __call__(self, logits: torch.Tensor, temperatures: list[float],
                 eos_allowed: list[bool]) -> list[int]:
        """logits (B, V) float32 -> B token ids."""
        self._block_eos(logits, eos_allowed)
        next_ids = greedy(logits)
        hot = [i for i, t in enumerate(temperatures) if t > 0]
        if hot:
            temps = torch.tensor([temperatures[i] for i in hot])[:, None]
            next_ids[hot] = self._draw(torch.softmax(logits[hot] / temps, dim=-1))
        return next_ids.tolist()

    def verify(self, logits: torch.Tensor, guesses: list[int], temperature: float,
               eos_allowed: list[bool]) -> list[int]:
        """One request's guesses checked against its logits (1 + g, V): row i is the model's
        distribution after the request's last token and its first i guesses. Returns the tokens
        it keeps, 1 to g + 1: the guesses the model agrees with, in order, then one token of the
        model's own (where it disagreed, or after the last guess: the "bonus" token).

        Greedy: a guess is kept when it is the row's argmax, so the tokens are exactly those of
        decoding one token a step. Temperature: rejection sampling (Leviathan et al. 2023) with a
        deterministic proposer, whose draft probability is 1 on its guess: guess x is kept with
        probability min(1, p(x) / 1) = p(x); on a rejection the token comes from the residual
        max(0, p - q) renormalised, i.e. p with x removed. Then each kept token has exactly the
        distribution p of the row it came from (vLLM's rejection_sampler.py does the same)."""
        self._block_eos(logits, eos_allowed)
        if temperature <= 0:
            target = greedy(logits).tolist()
            kept = []
            for guess, want in zip(guesses, target):
                if guess != want:
                    break
                kept.append(guess)
            return kept + [target[len(kept)]]
        probs = torch.softmax(logits / temperature, dim=-1)
        u = torch.rand(len(guesses), generator=self.generator)
        for i, guess in enumerate(guesses):
            if u[i] < probs[i, guess]:
                continue                              # kept: go on to the next guess
            residual = probs[i].clone()
            residual[guess] = 0.0
            if residual.sum() <= 0:                   # p was all on x: then u < p(x) held
                return guesses[:i] + [guess]
            return guesses[:i] + self._draw(residual[None]).tolist()
        return guesses + self._draw(probs[-1:]).tolist()
