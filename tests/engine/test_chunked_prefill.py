"""mini_engine's token budget and chunked prefill (issue 23), each rule on a case worked out by
hand: the config's two refusals, the issue's schedule of two decodes and a 40-token prompt at a
budget of 16, a prompt that waits for the budget with chunking off, a padding row's token of
budget, the bound on the steps reached exactly, and a budget that never binds changing nothing.
Then one test for each bug that users of other engines reported with chunked prefill:
attention over tokens not yet written; chunks sized before the prefix-cache hit is known; a
preempted request coming back with a hit; a prompt that is an exact multiple of the page size,
fully cached; a page hashed before its chunk was computed; a request's own earlier chunks
counted as cache hits; a token sampled from a chunk that is not the prompt's last.
(tests/engine/test_engine_properties.py searches the same rules over random workloads.) On the tiny
random model with a vocabulary of 1,024 (tiny_llama, tests/conftest.py), fp32, its token ids
below 1,024; counts and tokens are asserted, never times."""
from __future__ import annotations

import re
from functools import partial

import pytest
import torch

from mini_engine import EngineConfig, LLMEngine, State
from mini_engine.block_manager import cdiv
from mini_engine.kernels.attention import in_place_groups
from mini_engine.model import RequestChunk, make_batch
from tests import helpers
from tests.helpers import PAGE, ROOMY

# this file's cases, unless one says otherwise: a budget of 16 that binds, 3 requests a step
engine = partial(helpers.engine, budget=16, max_batch=3)


def alone(model, prompt: list[int], max_tokens: int, temperature: float = 0.0) -> list[int]:
    """The request by itself: a roomy pool and budget, no chunks, no cache."""
    eng = engine(model, budget=ROOMY, chunking=False, max_batch=1)
    seq = eng.add_request(prompt, max_tokens, temperature=temperature)
    eng.run()
    return seq.output_ids


def tokens(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def split(eng: LLMEngine, steps=None) -> list[tuple[int, int]]:
    """(decode tokens, prefill tokens) of each step."""
    return [(s.num_decode_tokens, s.num_prefill_tokens) for s in (steps or eng.steps)]


# --- the config ----------------------------------------------------------------------------------
def test_the_budget_defaults_to_vllms_and_chunking_is_on():
    config = EngineConfig(kv_bytes=1 << 20)
    assert (config.max_num_batched_tokens, config.enable_chunked_prefill) == (4096, True)
    # one token a step, at a cap of one, is the least budget there is
    assert EngineConfig(kv_bytes=1 << 20, max_batch=1, max_num_batched_tokens=1)


@pytest.mark.parametrize("overrides, message", [
    ({"max_batch": 16, "max_num_batched_tokens": 8},
     "EngineConfig.max_num_batched_tokens (8) is smaller than max_batch (16): a step could "
     "not give every running request its one token"),
    ({"max_num_batched_tokens": 0}, "EngineConfig.max_num_batched_tokens (0) is smaller than "
                                    "max_batch (16)"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 127},
     "EngineConfig.max_num_batched_tokens (127) is smaller than max_model_len (128) with "
     "enable_chunked_prefill off: a prompt that long could never be scheduled"),
    ({"max_num_batched_tokens": 64.0}, "EngineConfig.max_num_batched_tokens must be int"),
    ({"enable_chunked_prefill": 0}, "EngineConfig.enable_chunked_prefill must be bool, not 0"),
])
def test_a_budget_that_cannot_work_is_refused_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        EngineConfig(**{"kv_bytes": 1 << 20} | overrides)
    assert "\n" not in str(refused.value)


# --- schedules worked out by hand ----------------------------------------------------------------
def test_two_decodes_and_a_40_token_prompt_at_a_budget_of_16(tiny_llama):
    """The issue's schedule. A and B (4-token prompts) are admitted and make their first token
    in step 0; then C, a 40-token prompt, arrives. Each step the two decodes take 1 token each
    and C's prefill the 14 left: 14 + 14 + 12 = 40, so C's first token comes in the third step
    after its arrival, and A and B make a token in every step meanwhile (no stall)."""
    eng = engine(tiny_llama, budget=16, max_batch=3)
    a, b = (eng.add_request(tokens(100 + 10 * i, 4), 12) for i in range(2))
    eng.step()
    assert split(eng) == [(0, 8)] and (len(a.output_ids), len(b.output_ids)) == (1, 1)
    c = eng.add_request(tokens(300, 40), 4)
    made = []
    for _ in range(3):
        eng.step()
        made.append((len(a.output_ids), len(b.output_ids), len(c.output_ids)))
    assert split(eng)[1:] == [(2, 14), (2, 14), (2, 12)]
    assert [s.num_scheduled_tokens for s in eng.steps[1:]] == [(1, 1, 14)] * 2 + [(1, 1, 12)]
    assert [s.seq_ids for s in eng.steps[1:]] == [(0, 1, 2)] * 3
    assert [s.num_tokens for s in eng.steps[1:]] == [16, 16, 14]     # within the budget
    assert made == [(2, 2, 0), (3, 3, 0), (4, 4, 1)]
    assert eng.steps[2].end_s < c.first_token_s == c.token_times_s[0] <= eng.steps[3].end_s
    eng.run()
    assert split(eng)[4:] == [(3, 0)] * 3 + [(2, 0)] * 5
    for seq, (prompt, n) in zip((a, b, c), ((tokens(100, 4), 12), (tokens(110, 4), 12),
                                            (tokens(300, 40), 4))):
        assert seq.output_ids == alone(tiny_llama, prompt, n)
        assert len(seq.token_times_s) == n and seq.token_times_s == sorted(seq.token_times_s)
        assert seq.first_token_s == seq.token_times_s[0]


def test_without_chunks_the_prompt_comes_in_one_step_and_stalls_the_decodes_with_it(tiny_llama):
    """The same workload, chunking off (budget 64 >= max_model_len): C's 40 tokens in one step
    beside the two decodes; its first token comes at once, in the step every decode waits for."""
    eng = engine(tiny_llama, budget=64, chunking=False, max_batch=3)
    a, b = (eng.add_request(tokens(100 + 10 * i, 4), 12) for i in range(2))
    eng.step()
    c = eng.add_request(tokens(300, 40), 4)
    eng.step()
    assert split(eng) == [(0, 8), (2, 40)] and len(c.output_ids) == 1
    eng.run()
    assert c.output_ids == alone(tiny_llama, tokens(300, 40), 4)


def test_without_chunks_a_prompt_waits_until_its_whole_remainder_fits(tiny_llama):
    """Chunking off, budget 41 = max_model_len. A makes 3 tokens, B 6; C's 40-token prompt
    arrives after step 0. With two decodes running, 39 tokens are left: C waits (never a part
    of it), and is admitted in step 3, the first step with one decode: 1 + 40 = 41."""
    eng = engine(tiny_llama, budget=41, chunking=False, max_batch=3, max_model_len=41)
    a = eng.add_request(tokens(100, 4), 3)
    b = eng.add_request(tokens(110, 4), 6)
    eng.step()
    c = eng.add_request(tokens(300, 40), 1)
    eng.run()
    assert [s.num_tokens for s in eng.steps] == [8, 2, 2, 41, 1, 1]
    assert [s.seq_ids for s in eng.steps[:4]] == [(0, 1), (0, 1), (0, 1), (1, 2)]
    assert [len(s.output_ids) for s in (a, b, c)] == [3, 6, 1]
    assert c.output_ids == alone(tiny_llama, tokens(300, 40), 1)


def test_a_padding_row_costs_one_token_of_budget(tiny_llama):
    """Static batching, padding on, cap 3, budget 6. A (2-token prompt, 5 tokens), B (2, 1) and
    C (10, 1) form one batch; step 0: 2 + 2 + C's first 2, and B is done: it stays as padding.
    Step 1: A's decode and B's padding row take 1 each, C's prefill the 4 left; so again in
    step 2, where C reaches its last token and samples. Then A decodes beside two padding rows."""
    eng = engine(tiny_llama, budget=6, max_batch=3, policy="static")
    a = eng.add_request(tokens(100, 2), 5)
    b = eng.add_request(tokens(200, 2), 1)
    c = eng.add_request(tokens(300, 10), 1)
    eng.run()
    assert [s.num_scheduled_tokens for s in eng.steps] == \
        [(2, 2, 2), (1, 1, 4), (1, 1, 4), (1, 1, 1), (1, 1, 1)]
    assert [s.padding_ids for s in eng.steps] == [(), (1,), (1,), (1, 2), (1, 2)]
    # padding rows count among the decode tokens, one each, as the budget counts them
    assert split(eng) == [(0, 6), (2, 4), (2, 4), (3, 0), (3, 0)]
    assert [len(s.output_ids) for s in (a, b, c)] == [5, 1, 1]
    assert c.output_ids == alone(tiny_llama, tokens(300, 10), 1)


@pytest.mark.parametrize("budget, max_batch, steps", [
    # the bound, sum of ceil(prompt / (budget - cap + 1)) + max_tokens - 1, reached exactly:
    (1, 1, [1] * 7),          # one token a step: 5 prompt steps, then 2 decodes: 7
    (2, 1, [2, 2, 1, 1, 1]),  # ceil(5 / 2) = 3 prompt steps (its last makes a token), +2: 5
])
def test_the_bound_on_steps_is_reached(tiny_llama, budget, max_batch, steps):
    eng = engine(tiny_llama, budget=budget, max_batch=max_batch)
    seq = eng.add_request(tokens(100, 5), 3)
    eng.run()
    assert [s.num_tokens for s in eng.steps] == steps
    assert len(eng.steps) == cdiv(5, budget - max_batch + 1) + 3 - 1
    assert seq.output_ids == alone(tiny_llama, tokens(100, 5), 3)


@pytest.mark.parametrize("policy, pad", [("continuous", True), ("static", True),
                                         ("static", False)])
def test_a_budget_that_never_binds_changes_nothing(tiny_llama, policy, pad):
    """Tasks 9 and 10 run at the default budget of 4096, more than any step of theirs computes:
    a budget of the longest prompt x the cap, or chunking off, gives the same steps, rows, pages
    and tokens, sampled at temperature 0.7 from the same seed (so a padding row still draws)."""
    prompts = [tokens(100 + 50 * i, n) for i, n in enumerate([9, 3, 17, 1, 12, 6, 20])]
    runs = []
    for budget, chunking in ((ROOMY, True), (20 * 3, True), (ROOMY, False), (64, False)):
        eng = engine(tiny_llama, budget=budget, chunking=chunking, policy=policy, pad_finished=pad)
        seqs = [eng.add_request(p, 4 + i % 3, temperature=0.7) for i, p in enumerate(prompts)]
        eng.run()
        runs.append(([(s.seq_ids, s.padding_ids, s.num_tokens, s.num_pages_used)
                      for s in eng.steps], [s.output_ids for s in seqs]))
    assert all(run == runs[0] for run in runs)


# --- the bugs users reported elsewhere -----------------------------------------------------------
def garbage(eng: LLMEngine) -> None:
    """Fill the KV pool with large finite values, so any read of a slot not written this run
    changes the result (NaN would also spoil reads the mask rightly drops: 0 x NaN is NaN)."""
    gen = torch.Generator().manual_seed(1)
    for pool in eng.kv_cache:
        pool.copy_(torch.randn(pool.shape, generator=gen) * 100)


@pytest.mark.parametrize("in_place", [True, False], ids=["in place", "gathered"])
def test_a_chunk_attends_over_its_prompt_so_far_and_nothing_unwritten(tiny_llama, in_place):
    """A 20-token prompt in chunks of 8, 8 and 4 through the model itself, its pool full of
    garbage: each chunk's queries see exactly the positions written so far (the chunk's own rows
    included, each up to its position: in place, kernels/attention.py's groups, each row's
    context length; gathered, the torch way, the mask), and the last logits equal the prompt
    computed in one go."""
    ids, table = tokens(100, 20), [3, 1, 4, 0, 2]

    def logits(chunks):
        gen = torch.Generator().manual_seed(1)
        kv_cache = [torch.randn(tiny_llama.kv_cache_shape(8, PAGE), generator=gen) * 100
                    for _ in tiny_llama.layers]
        out = None
        for start, end in chunks:
            batch = make_batch([RequestChunk(ids[start:end], start, table,
                                             num_logits=int(end == len(ids)))], PAGE,
                               tiny_llama.heads_per_kv, tiny_llama.dtype,
                               in_place=in_place_groups if in_place else None)
            (group,) = batch.groups
            assert group.in_place == in_place
            assert group.context_len == end        # the context ends at the chunk's last token
            if in_place:                           # row q sees positions 0..q
                assert group.context_lens.tolist() == list(range(start + 1, end + 1))
            else:
                sees = group.mask[0, 0, :end - start] == 0   # (queries, context), a query head
                assert sees.tolist() == [[p <= q for p in range(end)] for q in range(start, end)]
            out = tiny_llama.forward(batch, kv_cache)
            assert out.shape[0] == (1 if end == len(ids) else 0)   # no logits mid-prompt
        return out

    whole = logits([(0, 20)])
    chunked = logits([(0, 8), (8, 16), (16, 20)])
    assert torch.allclose(whole, chunked, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernels", ["torch", "c"])
def test_chunks_beside_decodes_read_no_unwritten_slot_in_the_engine(tiny_llama, kernels):
    """The issue's schedule with the engine's pool full of garbage first, the torch way and with
    the kernels (the C reads the pages in place): the same tokens as each request alone (any
    read of a slot not yet written this run would change them)."""
    eng = engine(tiny_llama, budget=16, max_batch=3, kernels=kernels)
    garbage(eng)
    a, b = (eng.add_request(tokens(100 + 10 * i, 4), 12) for i in range(2))
    eng.step()
    c = eng.add_request(tokens(300, 40), 4)
    eng.run()
    assert [a.output_ids, b.output_ids, c.output_ids] == \
        [alone(tiny_llama, tokens(100, 4), 12), alone(tiny_llama, tokens(110, 4), 12),
         alone(tiny_llama, tokens(300, 40), 4)]


@pytest.mark.parametrize("head, num_chunks", [(32, [8]), (8, [16, 16])])
def test_the_chunk_is_sized_after_the_prefix_cache_hit(tiny_llama, head, num_chunks):
    """P, a 40-token prompt, runs first, and its 10 pages stay cached. Q shares P's first `head`
    tokens: it hits head / 4 pages and its chunks cover only the rest, from position head: 8 in
    one step (a chunk sized before the hit, min(40, 16) = 16, would run past the prompt), or
    32 in two of 16, the first token in the step of the last."""
    eng = engine(tiny_llama, budget=16, max_batch=1, caching=True)
    p = tokens(100, 40)
    eng.add_request(p, 1)
    eng.run()
    first = len(eng.steps)
    q = eng.add_request(p[:head] + tokens(900, 40 - head), 2)
    eng.step()
    assert q.num_cached_at_admission == head and eng.steps[-1].num_scheduled_tokens == \
        (num_chunks[0],)
    eng.run()
    assert [s.num_scheduled_tokens[0] for s in eng.steps[first:]] == num_chunks + [1]
    assert eng.block_manager.num_hit_tokens == head
    assert q.output_ids == alone(tiny_llama, q.prompt_ids, 2)


def test_a_request_preempted_in_its_prefill_comes_back_and_hits_its_own_pages(tiny_llama):
    """A pool of 12 pages of 4, budget 8, cap 2. X, a 28-token prompt making 12, fills 7 pages in
    4 chunks; A, a 20-token prompt, is admitted beside X's last chunk (4 tokens) and grows by 7
    a step while X decodes. In step 5 A's chunk needs more pages than are free: A, the newest, is
    preempted with 11 tokens computed, 2 pages of them full and cached. In the same step it comes
    back and hits them (8 tokens), is preempted again in step 6, and returns when X is done, its
    first 2 pages still cached. It never makes a token before its prompt is complete; its
    tokens are those it makes alone, and X makes one every step from its first."""
    eng = engine(tiny_llama, budget=8, max_batch=2, caching=True, num_pages=12, max_model_len=40)
    x = eng.add_request(tokens(100, 28), 12)
    a = eng.add_request(tokens(200, 20), 4)
    trace, made_by_x = [], []
    while eng.scheduler.has_work:
        eng.step()
        trace.append((a.state, a.num_cached_at_admission, a.num_preemptions, len(a.output_ids)))
        made_by_x.append(len(x.output_ids))
    assert made_by_x[:15] == [0, 0, 0] + list(range(1, 13))
    assert [t[2] for t in trace][4:7] == [0, 1, 2]                 # preempted in steps 5 and 6
    assert trace[5][:2] == (State.RUNNING, 8)                      # back in step 5, 2 pages hit
    assert trace[6][0] is State.PREEMPTED and trace[14][0] is State.PREEMPTED
    assert trace[15][:2] == (State.RUNNING, 8)                     # back when X is done
    assert all(t[3] == 0 for t in trace[:16]) and trace[16][3] == 1
    assert [s.num_scheduled_tokens for s in eng.steps[15:17]] == [(8,), (4,)]   # 8..15, 16..19
    assert eng.block_manager.num_hit_tokens == 16
    assert x.output_ids == alone(tiny_llama, tokens(100, 28), 12)
    assert a.output_ids == alone(tiny_llama, tokens(200, 20), 4)
    assert [len(st.seq_ids) for st in eng.steps[3:14]] == [2, 2, 2] + [1] * 8
    assert eng.block_manager.num_free == 12


def test_a_request_preempted_while_decoding_recomputes_in_chunks_and_keeps_its_first_token(
        tiny_llama):
    """A pool of 10 pages (one request of 40 tokens), budget 8, cap 2: X (4-token prompt, 30
    tokens) and A (30-token prompt, 2 tokens). A prefills in chunks of 4, 7, 7, 7 and 5, makes
    its first token in step 4, and is preempted in step 5 (X needs a page). It comes back when X
    is done, its own first page still cached (4 tokens): its prompt and first token (31)
    recomputed in chunks of 8, 8, 8 and 3, no token made before the last; then its second."""
    eng = engine(tiny_llama, budget=8, max_batch=2, caching=True, num_pages=10, max_model_len=40)
    x = eng.add_request(tokens(100, 4), 30)
    a = eng.add_request(tokens(200, 30), 2)
    made = []
    while eng.scheduler.has_work:
        eng.step()
        made.append(len(a.output_ids))
    assert a.num_preemptions == 1 and a.num_cached_at_admission == 4
    assert [s.num_scheduled_tokens for s in eng.steps[30:]] == [(8,), (8,), (8,), (3,)]
    assert made[4:] == [1] * 29 + [2] and made[:4] == [0] * 4
    first = a.first_token_s
    assert first == a.token_times_s[0] < eng.steps[5].end_s       # made before the preemption
    assert len(a.token_times_s) == 2
    assert a.output_ids == alone(tiny_llama, tokens(200, 30), 2)
    assert x.output_ids == alone(tiny_llama, tokens(100, 4), 30)


def test_a_prompt_of_whole_pages_fully_cached_still_computes_its_last_token(tiny_llama):
    """16 tokens = 4 full pages, all of them cached by a first run: the second run may hit 3
    ((16 - 1) // 4), never 4, so the last page is computed, in chunks of 2 at a budget of 2:
    tokens 12-13, then 14-15 with the first token. No row of any step computes 0 tokens."""
    eng = engine(tiny_llama, budget=2, max_batch=1, caching=True)
    p = tokens(100, 16)
    first = eng.add_request(p, 2)
    eng.run()
    n = len(eng.steps)
    again = eng.add_request(p, 2)
    eng.run()
    assert again.num_cached_at_admission == 12
    assert [s.num_scheduled_tokens for s in eng.steps[n:]] == [(2,), (2,), (1,)]
    assert all(min(s.num_scheduled_tokens) >= 1 for s in eng.steps)
    assert again.output_ids == first.output_ids == alone(tiny_llama, p, 2)


def test_a_page_is_registered_only_in_the_step_that_computes_it(tiny_llama):
    """A 40-token prompt at a budget of 16 (pages of 4): after its first chunk, 4 of its pages
    are in the cache, not the 10 its prompt fills; after the second chunk 8, after the third
    all 10. A copy of the prompt arriving after the first chunk could hit only those 4; it is
    admitted beside the first one's last chunk (the budget goes to the running prefill first),
    and then hits 9 pages, the most a 40-token prompt may, computed before or in that step."""
    eng = engine(tiny_llama, budget=16, max_batch=2, caching=True)
    p = tokens(100, 40)
    first = eng.add_request(p, 3)
    registered = []
    eng.step()
    registered.append((first.num_registered, len(eng.block_manager.hash_to_block_id)))
    assert len(eng.block_manager.cached_prefix(eng.add_request(p, 3))) == 4
    copy = eng.sequences[-1]
    for _ in range(2):
        eng.step()
        registered.append((first.num_registered, len(eng.block_manager.hash_to_block_id)))
    assert registered == [(4, 4), (8, 8), (10, 10)]
    assert copy.state is State.RUNNING and copy.num_cached_at_admission == 36
    eng.run()
    assert copy.output_ids == first.output_ids == alone(tiny_llama, p, 3)


def test_a_requests_own_earlier_chunks_are_no_cache_hits(tiny_llama):
    """A 40-token prompt in 5 chunks of 8, cache on: each chunk continues from the last, none
    looks itself up in the cache: 40 tokens queried, 0 hit. The same prompt again afterwards:
    40 more queried, 36 hit (9 pages: its last token is computed)."""
    eng = engine(tiny_llama, budget=8, max_batch=1, caching=True)
    p = tokens(100, 40)
    seq = eng.add_request(p, 2)
    eng.run()
    assert [s.num_scheduled_tokens for s in eng.steps] == [(8,)] * 5 + [(1,)]
    bm = eng.block_manager
    assert (bm.num_query_tokens, bm.num_hit_tokens, seq.num_cached_at_admission) == (40, 0, 0)
    again = eng.add_request(p, 2)
    eng.run()
    assert (bm.num_query_tokens, bm.num_hit_tokens, again.num_cached_at_admission) == (80, 36, 36)
    assert again.output_ids == seq.output_ids


class CountingSampler:
    """The engine's sampler, counting the rows it is handed at each step."""

    def __init__(self, sampler):
        self.sampler, self.eos_ids, self.rows = sampler, sampler.eos_ids, []

    def __call__(self, logits, *args):
        self.rows.append(logits.shape[0])
        return self.sampler(logits, *args)


def test_no_token_is_sampled_from_a_chunk_short_of_the_prompts_end(tiny_llama):
    """A 40-token prompt in chunks of 16, 16 and 8, sampled at temperature 1.0: the first two
    chunks compute no logits and draw nothing from the sampler's generator, so its tokens are
    the ones it makes from one unchunked step with the same seed."""
    eng = engine(tiny_llama, budget=16, max_batch=1)
    eng.sampler = counting = CountingSampler(eng.sampler)
    seq = eng.add_request(tokens(100, 40), 6, temperature=1.0)
    eng.step()
    eng.step()
    assert seq.output_ids == [] and seq.first_token_s is None
    eng.run()
    assert counting.rows == [0, 0, 1, 1, 1, 1, 1, 1]
    assert seq.output_ids == alone(tiny_llama, tokens(100, 40), 6, temperature=1.0)
