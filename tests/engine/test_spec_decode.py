"""mini_engine's speculative decoding (issue 24), each rule on a case worked out by hand: the
config's switch and refusals; the n-gram proposer against vLLM 0.27.1's own function; the
verifier's greedy rule by hand and its rejection sampling by a chi-square test (with wrong rules
that the same test catches); the issue's case, `a b c d a b` with k = 2 and n = 2, through the
engine, the rejected guess's K/V dropped. Then one test for each bug that users of other
engines reported: rejected guesses' K/V left in the cache or the cache reset instead of rolled
back; bonus tokens corrupting the cache at k > 1; the acceptance rule (the chi-square tests);
guesses running past max_tokens, max_model_len or EOS; unverified tokens in the prefix cache.
(tests/engine/test_engine_properties.py searches the same rules over random workloads.) fp32 on the
tiny random model with a vocabulary of 1,024 (tiny_llama, tests/conftest.py; token ids below
1,024); counts, tokens and K/V are asserted, never times.

The tiny random model mostly repeats its last token (over 300 random prompts of 1 to 24 ids,
16 greedy tokens each, 98.6% of its greedy steps did, and none switched twice in a row), so no
prompt makes it say three different tokens in a row, as `a b c` needs. The hand cases use
`counting`, the same model with its output rows shifted by one (lm_head row t + 1 = embedding
row t): where the tiny model would repeat t it says t + 1, so it counts. Its layers, hence every
K/V, are the tiny model's; only the logits move. Each case still reads the model's greedy tokens
first (speculation off) and builds its prompt from them.
"""
from __future__ import annotations

import json
import math
import re
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mini_engine import EngineConfig, LLMEngine, Llama, State
from mini_engine.block_manager import cdiv, page_hash
from mini_engine.proposer import NgramProposer
from mini_engine.sampler import Sampler
from tests import helpers
from tests.helpers import PAGE

# this file's cases, unless one says otherwise: n-grams of exactly 2 tokens, as in `a b c d a b`
engine = partial(helpers.engine, n=(2, 2))

# the hand cases' token ids, all below tiny_llama's 1,024 and far from its end (the counting
# model's rows wrap: after 1,023 it says 0): a is one of FIRST_IDS, d or z is a + FAR < 900
FIRST_IDS = range(100, 500, 11)
FAR = 400

# Chi-square critical values at alpha = 0.001 (a correct sampler fails 1 seed in 1,000): 18.467
# for 4 degrees of freedom, 16.266 for 3, as any table has them (e.g. NIST/SEMATECH e-Handbook
# of Statistical Methods, 1.3.6.7.4). test_the_critical_values_are_right checks them with the
# closed forms of the chi-square tail (scipy is not installed here).
CRITICAL = {4: 18.467, 3: 16.266}
NUM_DRAWS = 20_000      # per case: the wrong rules below miss by hundreds of standard errors


@pytest.fixture(scope="module")
def counting(small_vocab_model, tmp_path_factory):
    """The tiny model with lm_head row t + 1 = embedding row t (untied): it counts. A Llama
    of its own, from a folder of its own: the shared tiny_llama is left as it is."""
    from safetensors.torch import load_file, save_file

    src, out = Path(small_vocab_model), tmp_path_factory.mktemp("counting-llama")
    for name in ("config.json", "generation_config.json"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    weights = load_file(src / "model.safetensors")
    embed = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = torch.roll(embed, 1, dims=0).contiguous()
    save_file(weights, out / "model.safetensors")
    config = json.loads((out / "config.json").read_text()) | {"tie_word_embeddings": False}
    (out / "config.json").write_text(json.dumps(config))
    return Llama(str(out))


def greedy(model, prompt: list[int], max_tokens: int, eos: tuple = (), min_tokens: int = 0,
           max_model_len: int = 64) -> list[int]:
    """The request alone, speculation off: the reference every case is checked against."""
    eng = engine(model, max_batch=1, eos=eos, max_model_len=max_model_len)
    seq = eng.add_request(prompt, max_tokens, min_tokens)
    eng.run()
    return seq.output_ids


def kv_at(eng: LLMEngine, seq, num_positions: int) -> torch.Tensor:
    """K and V of seq's first num_positions positions, every layer: (layers, n, 2, KVH, D)."""
    page = eng.config.page_size
    slots = torch.tensor([seq.page_table[p // page] * page + p % page
                          for p in range(num_positions)], dtype=torch.long)
    return torch.stack([pool.view(-1, *pool.shape[2:])[slots] for pool in eng.kv_cache])


def reference_kv(model, token_ids: list[int], num_positions: int) -> torch.Tensor:
    """The K/V of token_ids' first num_positions positions, computed in one prefill."""
    eng = engine(model, max_batch=1)
    seq = eng.add_request(token_ids[:num_positions], 2)
    eng.step()
    assert seq.num_cached == num_positions
    return kv_at(eng, seq, num_positions)


def same_kv(a: torch.Tensor, b: torch.Tensor) -> bool:
    # one prefill of n rows against decodes and verifications of a few: the same fp32 sums in
    # another grouping, equal to rounding
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def count_case(model, prefix: list[int], run: int = 3, far: int = FAR) -> tuple[list[int], int]:
    """A prompt `prefix a b c d a` (b = a + 1, c = a + 2, d = a + far) on which the counting
    model says b, then c, then x != d, read from its greedy tokens: so at its first decode its
    tokens end `a b`, the proposer (n = 2) finds the earlier `a b` and guesses `c d`, and the
    model keeps c and says x instead of d. Returns (prompt, a)."""
    for a in FIRST_IDS:
        prompt = prefix + [a, a + 1, a + 2, a + far, a]
        out = greedy(model, prompt, run)
        if out[:2] == [a + 1, a + 2] and a + far not in out:
            return prompt, a
    raise AssertionError("no prompt found on which the counting model counts (the tiny model "
                         "changed?)")


def run_case(model, prefix: list[int], length: int) -> tuple[list[int], int]:
    """A prompt `prefix a a+1 ... a+length-1 z a a+1` (z = a + FAR) on which the counting
    model goes on a+2, a+3, ... up to a+length-1 (its greedy tokens): its first decode ends
    `a+1 a+2`, found in the earlier run, so the proposer guesses a+3, a+4, ... and the model
    keeps them all. Returns (prompt, a)."""
    for a in FIRST_IDS:
        prompt = prefix + list(range(a, a + length)) + [a + FAR, a, a + 1]
        out = greedy(model, prompt, length - 2)
        if out == list(range(a + 2, a + length)):
            return prompt, a
    raise AssertionError("no prompt found on which the counting model counts")


# --- the config ----------------------------------------------------------------------------------
def test_speculation_is_off_by_default(tiny_llama):
    config = EngineConfig(kv_bytes=1 << 20)
    assert (config.num_speculative_tokens, config.prompt_lookup_min,
            config.prompt_lookup_max) == (0, 2, 4)
    # a prompt full of repeats, decoded one token a step: no guess
    eng = engine(tiny_llama)
    seq = eng.add_request([5, 6, 5, 6, 5, 6, 5, 6], 6)
    eng.run()
    assert [s.num_scheduled_tokens for s in eng.steps] == [(8,)] + [(1,)] * 5
    assert sum(s.num_draft_tokens for s in eng.steps) == seq.num_draft_tokens == 0
    assert seq.output_was_guess == [False] * 6
    # off, the proposer's range is not used: nothing to refuse
    assert EngineConfig(kv_bytes=1 << 20, prompt_lookup_min=5, prompt_lookup_max=1)
    assert EngineConfig(kv_bytes=1 << 20, num_speculative_tokens=8, prompt_lookup_min=1,
                        prompt_lookup_max=1)


@pytest.mark.parametrize("overrides, message", [
    ({"num_speculative_tokens": -1}, "EngineConfig.num_speculative_tokens must be at least 0, "
                                     "not -1"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2},
     "EngineConfig.prompt_lookup_min (3) and prompt_lookup_max (2) must satisfy 1 <= min <= max"),
    ({"num_speculative_tokens": 2, "prompt_lookup_min": 0},
     "EngineConfig.prompt_lookup_min (0) and prompt_lookup_max (4) must satisfy 1 <= min <= max"),
    ({"num_speculative_tokens": 2.0}, "EngineConfig.num_speculative_tokens must be int, not 2.0"),
    ({"num_speculative_tokens": True}, "EngineConfig.num_speculative_tokens must be int, not True"),
    ({"num_speculative_tokens": 2, "prompt_lookup_max": "4"},
     "EngineConfig.prompt_lookup_max must be int, not '4'"),
])
def test_a_speculation_setting_that_cannot_work_is_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        EngineConfig(**{"kv_bytes": 1 << 20} | overrides)
    assert "\n" not in str(refused.value)


# --- the proposer --------------------------------------------------------------------------------
A, B, C, D = 1, 2, 3, 4


@pytest.mark.parametrize("k, n, tokens, max_guesses, guesses", [
    # the issue's case: `a b c d a b`, k = 2, n = 2: the earlier `a b` was followed by `c d`
    (2, (2, 2), [A, B, C, D, A, B], None, [C, D]),
    # k = 3: `c d a`; never past the end of what is known: k = 8 gives the 4 tokens there are
    (3, (2, 2), [A, B, C, D, A, B], None, [C, D, A]),
    (8, (2, 2), [A, B, C, D, A, B], None, [C, D, A, B]),
    # max_guesses cuts (the budget, max_tokens, max_model_len); 0 proposes nothing
    (2, (2, 2), [A, B, C, D, A, B], 1, [C]),
    (2, (2, 2), [A, B, C, D, A, B], 0, []),
    # the longest n wins: the tokens end `a b c`; `b c` came first at 1 (followed by 5),
    # `a b c` only at 4 (followed by 6): n up to 3 proposes 6, n = 2 alone 5
    (1, (2, 3), [9, B, C, 5, A, B, C, 6, A, B, C], None, [6]),
    (1, (2, 2), [9, B, C, 5, A, B, C, 6, A, B, C], None, [5]),
    # of equal matches the earliest (vLLM's rule): `a b` at 0 (then 7) and at 3 (then 8)
    (1, (2, 2), [A, B, 7, A, B, 8, A, B], None, [7]),
    (1, (2, 3), [A, B, 7, A, B, 8, A, B], None, [7]),   # no 3-gram matches: still the earliest
    # a match may overlap the suffix: `a a a` ends with `a a`, first at 0, followed by one `a`
    (3, (2, 2), [A, A, A], None, [A]),
    # no earlier occurrence of any n in [min, max] -> nothing
    (2, (2, 2), [A, B, C, D], None, []),
    (2, (3, 4), [A, B, C, D, A, B], None, []),       # `d a b` never came before
    (2, (1, 1), [A, B, C, D, A, B], None, [C, D]),   # n = 1: the earlier `b`
    # fewer tokens than the shortest n -> nothing
    (2, (3, 3), [A, B], None, []),
    (2, (1, 4), [], None, []),
    (2, (1, 4), [A], None, []),
])
def test_the_proposer_by_hand(k, n, tokens, max_guesses, guesses):
    assert NgramProposer(k, *n).propose(tokens, max_guesses) == guesses


@pytest.fixture(scope="module")
def vllm_find():
    """vLLM 0.27.1's own n-gram lookup (numba-jitted; mini_engine never imports vllm)."""
    module = pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    return module._find_longest_matched_ngram_and_propose_tokens


@settings(max_examples=400, deadline=None)
@given(tokens=st.lists(st.integers(1, 4), max_size=30), k=st.integers(1, 8),
       n_min=st.integers(1, 5), n_extra=st.integers(0, 3),
       max_guesses=st.none() | st.integers(0, 8))
def test_the_proposer_is_vllms(vllm_find, tokens, k, n_min, n_extra, max_guesses):
    """Random short token lists over 4 ids, so matches of every length occur: the same guesses
    as vLLM's function (max_model_len far away, so only k cuts it), cut to max_guesses."""
    n_max = n_min + n_extra
    theirs = vllm_find(np.array(tokens, dtype=np.int32), n_min, n_max, 1 << 20, k).tolist()
    if max_guesses is not None:
        theirs = theirs[:max_guesses]
    assert NgramProposer(k, n_min, n_max).propose(tokens, max_guesses) == theirs


# --- the verifier, greedy ------------------------------------------------------------------------
def rows(*argmaxes: int, vocab: int = 5, second: dict | None = None) -> torch.Tensor:
    """Logits with each row's argmax given (logit 3), an optional runner-up (logit 2), else 0."""
    logits = torch.zeros(len(argmaxes), vocab)
    for i, best in enumerate(argmaxes):
        logits[i, best] = 3.0
        if second and i in second:
            logits[i, second[i]] = 2.0
    return logits


@pytest.mark.parametrize("argmaxes, guesses, kept", [
    ((2, 3, 1), [2, 3], [2, 3, 1]),     # all accepted: g + 1 tokens, the bonus from the last row
    ((2, 3, 1), [2, 4], [2, 3]),        # the second rejected: the model's 3 in its place
    ((2, 3, 1), [0, 3], [2]),           # the first rejected: just the model's token
    ((2, 3, 1), [0, 4], [2]),           # nothing after a rejection counts, even a match
    ((4,), [], [4]),                    # no guesses: a plain decode
])
def test_greedy_keeps_the_guesses_the_argmax_agrees_with_then_its_own_token(argmaxes, guesses,
                                                                           kept):
    sampler = Sampler(eos_ids=[])
    assert sampler.verify(rows(*argmaxes), guesses, 0.0, [True] * len(argmaxes)) == kept


def test_greedy_verification_blocks_eos_where_it_is_not_allowed():
    """EOS is token 0. Row 1's argmax is EOS, its runner-up 3. A guess of EOS is accepted where
    EOS is allowed; where it is not (min_tokens), the row's argmax is 3: the guess is rejected
    and 3 comes instead. A row whose argmax is not EOS is unchanged by the block."""
    sampler = Sampler(eos_ids=[0])
    logits = rows(1, 0, 2, second={1: 3})
    assert sampler.verify(logits.clone(), [1, 0], 0.0, [True, True, True])[:2] == [1, 0]
    assert sampler.verify(logits.clone(), [1, 0], 0.0, [True, False, True]) == [1, 3]
    assert sampler.verify(logits.clone(), [1, 3], 0.0, [True, False, True]) == [1, 3, 2]
    assert sampler.verify(logits.clone(), [1, 3], 0.0, [False, False, False]) == [1, 3, 2]


# --- the verifier, temperature: rejection sampling, tested statistically ------------------------
P_ALL = [0.05, 0.10, 0.15, 0.30, 0.40]     # every token possible: V = 5, 4 degrees of freedom
P_ZERO = [0.25, 0.00, 0.35, 0.15, 0.25]    # token 1 impossible: 4 possible, 3 degrees of freedom
P_SECOND = [0.30, 0.25, 0.20, 0.15, 0.10]
P_THIRD = [0.10, 0.35, 0.05, 0.20, 0.30]
P_FIRST = [0.10, 0.05, 0.60, 0.15, 0.10]   # its guess 2 is kept 60% of the time


def logits_of(*dists: list[float], temperature: float = 1.0) -> torch.Tensor:
    """Logits whose softmax at this temperature is each dist (log 0 = -inf: impossible)."""
    return torch.tensor(dists).log() * temperature


def chi_square(counts: list[int], p: list[float]) -> tuple[float, int]:
    """Pearson's statistic over the possible tokens, and its degrees of freedom."""
    total = sum(counts)
    cells = [(c, total * q) for c, q in zip(counts, p) if q > 0]
    return sum((c - e) ** 2 / e for c, e in cells), len(cells) - 1


def follows(tokens: list[int], p: list[float]) -> bool:
    counts = [tokens.count(v) for v in range(len(p))]
    if any(c for c, q in zip(counts, p) if q == 0):
        return False                                  # an impossible token was emitted
    stat, dof = chi_square(counts, p)
    return stat < CRITICAL[dof]


def test_the_critical_values_are_right():
    """The chi-square tail has closed forms for 3 and 4 degrees of freedom:
    Q(x; 4) = e^(-x/2) (1 + x/2), Q(x; 3) = erfc(sqrt(x/2)) + sqrt(2x/pi) e^(-x/2)."""
    q4 = math.exp(-CRITICAL[4] / 2) * (1 + CRITICAL[4] / 2)
    x = CRITICAL[3]
    q3 = math.erfc(math.sqrt(x / 2)) + math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    assert q4 == pytest.approx(0.001, rel=1e-3) and q3 == pytest.approx(0.001, rel=1e-3)


def draws(verify, logits: torch.Tensor, guesses: list[int], temperature: float,
          num: int = NUM_DRAWS) -> list[list[int]]:
    return [verify(logits.clone(), guesses, temperature, [True] * len(logits))
            for _ in range(num)]


# Wrong acceptance rules (the issue's bug: a rule other than u < p_target / p_draft, here with
# p_draft = 1 on the guess), for the negative controls: the same test must fail them, or it
# could not fail at all.
def draw_from(p: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def wrong_verifier(rule: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def verify(logits, guesses, temperature, eos_allowed):
        probs = torch.softmax(logits / temperature, dim=-1)
        for i, x in enumerate(guesses):
            u = float(torch.rand(1, generator=gen))
            keep = {"always accept": True, "p squared": u < probs[i, x] ** 2,
                    "resample from p": u < probs[i, x]}[rule]
            if keep:
                continue
            residual = probs[i].clone()
            if rule != "resample from p":     # the bug: x not removed from the resample
                residual[x] = 0
            return guesses[:i] + [draw_from(residual, gen)]
        return guesses + [draw_from(probs[-1], gen)]
    return verify


@pytest.mark.parametrize("p, guess, temperature", [
    (P_ALL, 4, 1.0),      # a guess the model likes (p = 0.40)
    (P_ALL, 0, 1.0),      # a guess it does not (p = 0.05)
    (P_ALL, 4, 0.5),      # the same at temperature 0.5 (the logits scaled to give the same p)
    (P_ZERO, 1, 1.0),     # an impossible guess (p = 0): never emitted, and p still followed
])
def test_the_first_token_follows_p_whatever_the_guess(p, guess, temperature):
    """Rejection sampling with a deterministic guess x: x kept with probability p(x), else a
    token from p with x removed: P(x) = p(x) and P(y) = (1 - p(x)) p(y) / (1 - p(x)) = p(y).
    20,000 draws from a fixed seed: the first token's counts against p, chi-square at 0.001."""
    sampler = Sampler(eos_ids=[], seed=0)
    out = draws(sampler.verify, logits_of(p, P_SECOND, temperature=temperature), [guess],
                temperature)
    assert all(1 <= len(o) <= 2 for o in out)
    assert all(len(o) == 2 for o in out if o[0] == guess)      # kept: the bonus follows
    assert all(len(o) == 1 for o in out if o[0] != guess)      # rejected: its replacement only
    first = [o[0] for o in out]
    stat, dof = chi_square([first.count(v) for v in range(5)], p)
    assert stat < CRITICAL[dof], f"chi-square {stat:.1f} > {CRITICAL[dof]} (df {dof})"
    if p[guess] == 0:
        assert guess not in first


@pytest.mark.parametrize("rule", ["always accept", "p squared", "resample from p"])
def test_the_chi_square_test_catches_a_wrong_acceptance_rule(rule):
    """The negative control: the same draws from a wrong rule fail the same test, for a guess
    the model likes (p = 0.40) and one it does not (p = 0.05)."""
    for guess in (4, 0):
        out = draws(wrong_verifier(rule), logits_of(P_ALL, P_SECOND), [guess], 1.0)
        assert not follows([o[0] for o in out], P_ALL), f"{rule!r} passed for guess {guess}"


def test_after_an_accepted_guess_the_next_token_follows_the_next_row():
    """Two guesses, 2 then 1, over three rows p1, p2, p3. Given the first guess was kept, the
    second token follows p2 (kept 1 with p2(1), else p2 without 1: p2 in all); given both were
    kept, the bonus token follows p3. The first guess is kept p1(2) = 60% of the time."""
    sampler = Sampler(eos_ids=[], seed=1)
    out = draws(sampler.verify, logits_of(P_FIRST, P_SECOND, P_THIRD), [2, 1], 1.0)
    kept_first = [o for o in out if o[0] == 2]
    assert all(len(o) >= 2 for o in kept_first) and all(len(o) == 1 for o in out if o[0] != 2)
    assert follows([o[0] for o in out], P_FIRST)
    assert follows([o[1] for o in kept_first], P_SECOND)
    kept_both = [o for o in kept_first if o[1] == 1]
    assert all(len(o) == 3 for o in kept_both)
    assert follows([o[2] for o in kept_both], P_THIRD)
    # and the wrong rule that resamples from p fails the conditional test too
    wrong = draws(wrong_verifier("resample from p"), logits_of(P_FIRST, P_SECOND, P_THIRD),
                  [2, 1], 1.0)
    assert not follows([o[1] for o in wrong if o[0] == 2 and len(o) > 1], P_SECOND)


def test_a_guess_the_model_is_sure_of_is_always_kept():
    """p(x) = 1 (every other token impossible): u < 1 always, so the guess is kept every time,
    here both guesses, then the bonus from the last row."""
    sure_2, sure_4 = [0, 0, 1.0, 0, 0], [0, 0, 0, 0, 1.0]
    sampler = Sampler(eos_ids=[], seed=2)
    out = draws(sampler.verify, logits_of(sure_2, sure_4, P_ALL), [2, 4], 1.0, num=2000)
    assert all(o[:2] == [2, 4] and len(o) == 3 for o in out)
    assert follows([o[2] for o in out], P_ALL)


def test_temperature_verification_blocks_eos_where_it_is_not_allowed():
    """EOS (token 4, p = 0.40) guessed where it is not allowed: never kept, never emitted, and
    the first token follows p without EOS."""
    sampler = Sampler(eos_ids=[4], seed=3)
    logits = logits_of(P_ALL, P_SECOND)
    first = [sampler.verify(logits.clone(), [4], 1.0, [False, True])[0] for _ in range(NUM_DRAWS)]
    assert 4 not in first
    no_eos = [q / (1 - P_ALL[4]) for q in P_ALL[:4]] + [0.0]
    assert follows(first, no_eos)


# --- the engine: the issue's case ----------------------------------------------------------------
def test_the_issues_case_one_guess_kept_the_models_token_after_it_and_ds_kv_gone(counting):
    """The prompt is `s a b c d a` (b = a + 1, c = a + 2: the counting model says b after it,
    then c, then x, not d: a + 3 as it counts on). Step 0 computes the prompt and makes b: the
    request's tokens are `s a b c d a b`. Step 1, k = 2 and n = 2: the proposer finds the
    earlier `a b` and guesses `c d`; the step computes b, c and d (3 rows, positions 6, 7, 8, so
    d lands in a third page of 4); the model agrees with c, says x instead of d: the request
    keeps `c x`, its cached length goes back to 8 (s ... b c: x is the token left to compute)
    and d's page goes back to the front of the free queue. Step 2 computes x into that same
    slot. After each step the K/V of every cached position is the one a run without
    speculation computes."""
    prompt, a = count_case(counting, prefix=[77])
    without = greedy(counting, prompt, 6)
    b, c, d, x = a + 1, a + 2, a + FAR, without[2]
    assert x != d and NgramProposer(2, 2, 2).propose(prompt + [b]) == [c, d]
    # the K/V a run without speculation computes, in an engine of its own
    reference = reference_kv(counting, prompt + without, len(prompt) + 5)
    eng = engine(counting, k=2, n=(2, 2), page_size=PAGE, num_pages=16)
    seq = eng.add_request(prompt, 6)
    eng.step()
    assert seq.output_ids == [b] and seq.num_cached == 6 and len(seq.page_table) == 2

    eng.step()
    step = eng.steps[-1]
    assert (step.num_scheduled_tokens, step.num_draft_tokens, step.num_accepted_tokens,
            step.num_output_tokens) == ((3,), 2, 1, (2,))
    assert step.num_pages_used == 3                    # as scheduled: d needed a third page
    assert seq.output_ids == [b, c, x] and seq.output_was_guess == [False, True, False]
    assert (seq.num_draft_tokens, seq.num_accepted_tokens) == (2, 1)
    assert seq.num_tokens == 9 and seq.num_cached == 8 == seq.num_tokens - 1
    assert len(seq.page_table) == cdiv(8, PAGE) == 2
    bm = eng.block_manager
    assert bm.num_free == bm.num_pages - 2
    d_page = next(iter(bm.free_queue))                 # back at the front: handed out next
    assert d_page not in seq.page_table and bm.blocks[d_page].ref_count == 0
    assert same_kv(kv_at(eng, seq, 8), reference[:, :8])

    eng.step()                                          # x computed, into d's old slot
    assert seq.page_table[2] == d_page and seq.num_cached >= 9
    assert same_kv(kv_at(eng, seq, 9), reference[:, :9])
    eng.run()
    assert seq.output_ids == without
    assert bm.num_free == bm.num_pages


# --- the bugs users reported elsewhere -----------------------------------------------------------
def test_a_rejection_rolls_back_without_resetting_or_touching_earlier_pages(counting):
    """Two requests share an 8-token prefix (2 full pages, prefix cache on): A's tokens are
    `prefix a b c d a`, B's the prefix and 6 others. When A's guess d is rejected, A's cached
    length is what was verified (not what was guessed, and not 0: a reset would compute its
    whole prefix again), its earlier pages keep their ids and their K/V bit for bit, the shared
    pages stay shared by both, and the next step computes only A's token and its guesses."""
    prefix = list(range(300, 308))
    prompt, a = count_case(counting, prefix=prefix)
    other = prefix + list(range(600, 606))
    eng = engine(counting, k=2, n=(2, 2), caching=True, num_pages=16)
    seq_a, seq_b = eng.add_request(prompt, 6), eng.add_request(other, 6)
    eng.step()                                          # both prefills; B hits A's 2 pages
    assert seq_b.num_cached_at_admission == 8 and seq_a.page_table[:2] == seq_b.page_table[:2]
    shared = seq_a.page_table[:2]
    cached_before, pages_before = seq_a.num_cached, list(seq_a.page_table)
    kv_before = kv_at(eng, seq_a, cached_before).clone()
    shared_kv = torch.stack([pool[shared].clone() for pool in eng.kv_cache])

    eng.step()                                          # A verifies `c d`: keeps c, x
    assert eng.steps[-1].num_draft_tokens >= 2 and seq_a.output_was_guess == [False, True, False]
    assert seq_a.num_cached == cached_before + 2 == seq_a.num_tokens - 1
    assert seq_a.page_table[:len(pages_before)] == pages_before
    assert len(seq_a.page_table) == cdiv(seq_a.num_cached, PAGE)
    assert torch.equal(kv_at(eng, seq_a, cached_before), kv_before)
    assert torch.equal(torch.stack([pool[shared] for pool in eng.kv_cache]), shared_kv)
    assert all(eng.block_manager.blocks[p].ref_count == 2 for p in shared)

    eng.step()
    step = eng.steps[-1]
    assert step.num_prefill_tokens == 0                 # nothing recomputed
    assert all(n == 1 + g for n, g in zip(step.num_scheduled_tokens, (
        len(s.spec_token_ids) for s in (seq_a, seq_b))))
    eng.run()
    assert seq_a.output_ids == greedy(counting, prompt, 6)
    assert seq_b.output_ids == greedy(counting, other, 6)


def test_bonus_tokens_at_k_4_leave_every_token_and_every_kv_as_without_speculation(counting):
    """k = 4, pages of 4: the prompt has a run a ... a+15 then `z a a+1`, so each decode
    guesses the next 4 of the run and the counting model keeps all 4 plus its bonus token: 5
    tokens a step across page boundaries. Every token equals speculation off, and after every
    step the K/V of every cached position equals one prefill's (a bonus token written at the
    wrong position, or a guess's K/V kept under the bonus token, would differ)."""
    prompt, a = run_case(counting, prefix=[77], length=16)
    eng = engine(counting, k=4, n=(2, 4), num_pages=32)
    seq = eng.add_request(prompt, 14)
    snapshots = []
    while eng.scheduler.has_work:
        eng.step()
        if seq.page_table:
            snapshots.append((seq.num_cached, kv_at(eng, seq, seq.num_cached).clone()))
    assert seq.output_ids == greedy(counting, prompt, 14) == list(range(a + 2, a + 16))
    steps = eng.steps[1:]
    assert any(s.num_draft_tokens == s.num_accepted_tokens == 4 for s in steps)
    assert [s.num_output_tokens for s in steps][:2] == [(5,), (5,)]     # 4 guesses + the bonus
    final = reference_kv(counting, seq.token_ids, len(seq.token_ids) - 1)
    for num_cached, kv in snapshots:
        assert same_kv(kv, final[:, :num_cached]), f"K/V differ with {num_cached} cached"


def test_guesses_are_cut_so_the_request_ends_exactly_at_max_tokens(counting):
    """k = 4, the counting run ahead, max_tokens = 4: after the prefill's token only 2 guesses
    may be verified (2 guesses + the model's token = the 3 tokens left), so the request ends in
    its second step with exactly 4 tokens, those of speculation off."""
    prompt, a = run_case(counting, prefix=[77], length=16)
    eng = engine(counting, k=4, n=(2, 4))
    seq = eng.add_request(prompt, 4)
    eng.run()
    assert [s.num_scheduled_tokens for s in eng.steps][1:] == [(3,)]
    assert eng.steps[1].num_draft_tokens == 2 and seq.num_draft_tokens == 2
    assert seq.output_ids == greedy(counting, prompt, 4) and len(seq.output_ids) == 4
    assert seq.is_finished and eng.block_manager.num_free == eng.num_pages


def test_guesses_never_run_past_max_model_len(counting):
    """max_model_len = prompt + 10, pages of 4 with max_model_len - 1 a multiple of 4: the last
    token is never computed, so no step may hold more than (max_model_len - 1) / 4 pages; a
    guess past the end would need one more. The request ends with exactly max_model_len tokens.
    (add_request keeps prompt + max_tokens within max_model_len, so the max_tokens cut is never
    looser than the max_model_len one: here they meet.)"""
    prompt, a = run_case(counting, prefix=[77, 78, 79, 80], length=16)
    max_model_len = len(prompt) + 10
    assert (max_model_len - 1) % PAGE == 0
    eng = engine(counting, k=4, n=(2, 4), max_model_len=max_model_len)
    seq = eng.add_request(prompt, 10)
    eng.run()
    assert seq.num_tokens == max_model_len and seq.num_draft_tokens > 0
    assert max(s.num_pages_used for s in eng.steps) <= (max_model_len - 1) // PAGE
    assert seq.output_ids == greedy(counting, prompt, 10, max_model_len=max_model_len)


def test_an_eos_inside_the_kept_guesses_ends_the_request_there(counting):
    """k = 4: the first decode guesses a+3 ... a+6 and the model keeps all 4; with a+4 an end of
    sequence the request ends at it (3 tokens: a+2, then the kept guesses a+3, a+4), as one
    token a step would; the guesses after it are dropped and every page is free."""
    prompt, a = run_case(counting, prefix=[77], length=16)
    eos = (a + 4,)
    eng = engine(counting, k=4, n=(2, 4), eos=eos)
    seq = eng.add_request(prompt, 12)
    eng.run()
    assert seq.output_ids == [a + 2, a + 3, a + 4] == greedy(counting, prompt, 12, eos=eos)
    assert seq.output_was_guess == [False, True, True] and seq.num_draft_tokens == 4
    assert len(eng.steps) == 2 and seq.is_finished
    assert eng.block_manager.num_free == eng.num_pages


def test_min_tokens_holds_an_eos_guess_off(counting):
    """The same with min_tokens 3: a+4 would be the 3rd token, and EOS may come 4th at the
    earliest (as min_tokens blocks it one token a step), so the verifier rejects that guess
    (the row's argmax with EOS blocked is another token) and the request goes on: the tokens of
    speculation off with the same min_tokens, no EOS among the first 3."""
    prompt, a = run_case(counting, prefix=[77], length=16)
    eos = (a + 4,)
    eng = engine(counting, k=4, n=(2, 4), eos=eos)
    seq = eng.add_request(prompt, 8, min_tokens=3)
    eng.run()
    assert seq.output_ids == greedy(counting, prompt, 8, eos=eos, min_tokens=3)
    assert seq.output_ids[:2] == [a + 2, a + 3] and a + 4 not in seq.output_ids[:3]
    assert eng.steps[1].num_draft_tokens == 4 and eng.steps[1].num_accepted_tokens == 1
    assert len(seq.output_ids) == 8 or (seq.output_ids[-1] in eos and len(seq.output_ids) >= 4)


def test_no_unverified_token_enters_the_prefix_cache(counting):
    """Prefix cache on, pages of 4. The prompt is `a b c d a`: the first decode guesses `c d`,
    so the step computes b, c, d at positions 5, 6, 7, which fill page 1 with `a b c d`. d is
    rejected: no page holds it in the cache. After every step each hash in the cache is that of
    a page of tokens the request has verified; a later prompt `a b c d a b c d ...` (the guessed
    text) hits only page 0, and one with the verified text `a b c d a b c x ...` hits 2 pages."""
    prompt, a = count_case(counting, prefix=[])
    b, c, d = a + 1, a + 2, a + FAR
    eng = engine(counting, k=2, n=(2, 2), caching=True, num_pages=16)
    seq = eng.add_request(prompt, 6)
    bm = eng.block_manager

    def verified_hashes() -> set:
        tokens, hashes, parent = seq.token_ids[:seq.num_cached], set(), None
        for i in range(len(tokens) // PAGE):
            parent = page_hash(parent, tokens[i * PAGE:(i + 1) * PAGE])
            hashes.add(parent)
        return hashes

    while eng.scheduler.has_work:
        eng.step()
        if seq.page_table:
            assert set(bm.hash_to_block_id) <= verified_hashes(), "an unverified page is cached"
            assert seq.num_registered <= seq.num_cached // PAGE
            for i, page in enumerate(seq.page_table):
                if bm.blocks[page].hash is not None:
                    assert bm.blocks[page].token_ids == tuple(seq.token_ids[i * PAGE:
                                                                            (i + 1) * PAGE])
    assert eng.steps[1].num_draft_tokens == 2 and eng.steps[1].num_accepted_tokens == 1
    x = seq.output_ids[2]
    assert x != d and seq.output_ids == greedy(counting, prompt, 6)
    guessed = eng.add_request([a, b, c, d, a, b, c, d, 5], 1)
    verified = eng.add_request([a, b, c, d, a, b, c, x, 5], 1)
    assert len(bm.cached_prefix(guessed)) == 1 and len(bm.cached_prefix(verified)) == 2


def test_temperature_with_speculation_is_reproducible_and_makes_exactly_its_tokens(tiny_llama):
    """At temperature 0.1 (where the tiny model's repeats are likely, not certain) the verifier
    draws from the seeded generator: guesses are kept and rejected, the same seed gives the
    same tokens, every request makes exactly max_tokens (no EOS), and every page comes back."""
    prompts = [[5, 6, 5, 6, 5, 6], [9] * 8, [100, 200, 300, 100, 200]]

    def run():
        eng = engine(tiny_llama, k=3, n=(1, 3), num_pages=32)
        seqs = [eng.add_request(p, 12, temperature=0.1) for p in prompts]
        eng.run()
        assert eng.block_manager.num_free == eng.num_pages
        return eng, seqs

    (eng, first), (_, second) = run(), run()
    assert [s.output_ids for s in first] == [s.output_ids for s in second]
    assert all(len(s.output_ids) == 12 and s.state is State.FINISHED for s in first)
    assert all(s.num_accepted_tokens <= s.num_draft_tokens for s in first)
    assert sum(s.num_draft_tokens for s in first) > sum(s.num_accepted_tokens for s in first) > 0
