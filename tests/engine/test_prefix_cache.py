"""mini_engine's automatic prefix caching, each rule on a case worked out by hand: the hash chain,
LRU eviction, a prompt of exactly whole pages, same-step admission, preemption of a request
holding shared pages, and the tokens with and without the cache
(tests/engine/test_engine_properties.py searches the same invariants over random workloads)."""
from __future__ import annotations

import pytest

from mini_engine.block_manager import BlockManager, page_hash
from mini_engine.sequence import Sequence
from tests.helpers import PAGE, engine


def seq(seq_id: int, prompt: list[int], max_tokens: int = 4) -> Sequence:
    return Sequence(seq_id, list(prompt), max_tokens)


def test_the_hash_chain_fingerprints_the_prefix_not_the_page():
    a, b = page_hash(None, [1, 2, 3, 4]), page_hash(None, [9, 9, 9, 9])
    assert page_hash(a, [5, 6, 7, 8]) == page_hash(a, [5, 6, 7, 8])       # same prefix, same hash
    assert page_hash(a, [5, 6, 7, 8]) != page_hash(b, [5, 6, 7, 8])       # same page, other parent
    assert page_hash(None, [1, 2, 3, 4]) != page_hash(None, [1, 2, 3, 5])
    assert len(a) == 32                                                   # sha256, as vLLM


def test_a_request_takes_the_longest_cached_run_and_computes_the_rest():
    bm = BlockManager(num_pages=8, page_size=PAGE, enable_prefix_caching=True)
    first = seq(0, list(range(1, 11)))              # 10 tokens: pages [1-4] [5-8] full, [9 10]
    bm.admit(first)
    assert first.page_table == [0, 1, 2] and first.num_cached == 0
    assert sorted(bm.hash_to_block_id.values()) == [0, 1]        # its two full pages registered
    # the same first page, then other tokens: one page hit, the rest new
    second = seq(1, [1, 2, 3, 4, 50, 60, 70, 80, 90])
    bm.admit(second)
    assert second.page_table[0] == 0 and second.num_cached == 4
    assert [bm.blocks[i].ref_count for i in range(3)] == [2, 1, 1]
    # 19 tokens looked up, 4 found (vLLM's prefix_cache_queries / _hits)
    assert (bm.num_query_tokens, bm.num_hit_tokens) == (19, 4)


def test_a_prompt_of_exactly_whole_pages_recomputes_its_last_page():
    """8 tokens = 2 full pages, both cached: the last token must be computed for its logits, so
    only (8 - 1) // 4 = 1 page may hit. (nano-vllm's reported crash: all pages hit, nothing left
    to compute.)"""
    bm = BlockManager(num_pages=8, page_size=PAGE, enable_prefix_caching=True)
    bm.admit(seq(0, list(range(1, 9))))
    again = seq(1, list(range(1, 9)))
    assert len(bm.cached_prefix(again)) == 1
    bm.admit(again)
    assert again.num_cached == 4 and len(again.page_table) == 2
    assert again.page_table[1] != 1       # its second page is its own: it writes there


def test_freed_pages_stay_cached_and_are_evicted_least_recently_freed_first():
    bm = BlockManager(num_pages=4, page_size=PAGE, enable_prefix_caching=True)
    a, b = seq(0, [1, 2, 3, 4, 5]), seq(1, [6, 7, 8, 9, 10])   # a full page and one token each
    bm.admit(a)                       # pages 0 (full, cached), 1
    bm.admit(b)                       # pages 2 (full, cached), 3
    bm.free(a)                        # tail first: the free queue is now 1, 0
    bm.free(b)                        # ... 1, 0, 3, 2
    assert list(bm.free_queue) == [1, 0, 3, 2]
    assert set(bm.hash_to_block_id.values()) == {0, 2}        # freed, still cached
    assert bm.cached_prefix(seq(2, [1, 2, 3, 4, 99])) == [0]   # a's page hits after a left
    # a new request of 3 pages (no hit) takes the queue's front: 1, then 0 (a's cached page,
    # evicted, its hash forgotten), then 3; b's cached page 2, freed last, survives
    c = seq(3, list(range(100, 112)))
    bm.admit(c)
    assert c.page_table == [1, 0, 3] and bm.num_evictions == 1
    assert set(bm.hash_to_block_id.values()) == {0, 1, 2, 3}   # c's 3 full pages, and b's
    assert bm.cached_prefix(seq(4, [1, 2, 3, 4, 99])) == []    # a's prefix is gone
    assert bm.cached_prefix(seq(5, [6, 7, 8, 9, 99])) == [2]   # b's is not


def test_a_hit_on_a_free_cached_page_takes_it_off_the_free_queue():
    bm = BlockManager(num_pages=3, page_size=PAGE, enable_prefix_caching=True)
    a = seq(0, [1, 2, 3, 4, 5])
    bm.admit(a)
    bm.free(a)
    assert bm.num_free == 3
    b = seq(1, [1, 2, 3, 4, 6, 7])
    assert bm.can_admit(b)            # 1 new page + 1 revived page <= 3 free
    bm.admit(b)
    assert b.page_table[0] == 0 and 0 not in bm.free_queue and bm.blocks[0].ref_count == 1
    assert bm.num_free == 1


def run(model, prompts, caching: bool, max_batch: int = 4, num_pages: int = 40, **kw):
    eng = engine(model, num_pages=num_pages, max_batch=max_batch, max_model_len=40,
                 caching=caching, **kw)
    seqs = [eng.add_request(p, 6, min_tokens=6) for p in prompts]
    eng.run()
    return eng, seqs


# token ids within the 1,024 of tiny_llama's vocabulary (tests/conftest.py)
SYSTEM = list(range(500, 512))                        # 12 tokens: 3 full pages of 4
PROMPTS = [SYSTEM + [600 + i, 700 + i] for i in range(4)]


def test_same_step_admission_shares_the_prefix(tiny_llama):
    """Four requests with the same 12-token prefix admitted in one step: the first registers its 3
    prefix pages when admitted, the other three hit them in that same step (as vLLM registers
    blocks when it schedules them) and read their K/V in the same forward. 4 x 14 = 56 prompt
    tokens, 3 x 12 = 36 taken from the cache."""
    eng, seqs = run(tiny_llama, PROMPTS, caching=True)
    assert [s.num_cached_at_admission for s in seqs] == [0, 12, 12, 12]
    assert (eng.block_manager.num_query_tokens, eng.block_manager.num_hit_tokens) == (56, 36)
    assert eng.steps[0].num_tokens == 14 + 3 * 2      # computed: one whole prompt + 3 tails
    # pages held at the peak: 3 shared + 4 x 2 own (tokens 13-20 of each) = 11, against 4 x 5 = 20
    assert max(s.num_pages_used for s in eng.steps) == 11
    _, plain = run(tiny_llama, PROMPTS, caching=False)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]


def test_preempting_a_request_that_holds_shared_pages(tiny_llama):
    """A pool of 10 pages (40 tokens, one full request) for the four requests: they share the 3
    prefix pages, grow, and the newest are preempted. A preempted request drops its references
    (the shared pages stay with the others), comes back, hits its prefix again and ends with the
    same tokens as without the cache."""
    eng, seqs = run(tiny_llama, [p + list(range(800, 810)) for p in PROMPTS], caching=True,
                    num_pages=10)
    _, plain = run(tiny_llama, [p + list(range(800, 810)) for p in PROMPTS], caching=False,
                   num_pages=10)
    assert eng.scheduler.num_preemptions > 0
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain]
    assert all(b.ref_count == 0 for b in eng.block_manager.blocks)
    assert eng.block_manager.num_free == 10


@pytest.mark.parametrize("policy, pad", [("static", True), ("static", False), ("continuous", True)])
def test_the_cache_changes_no_token_under_any_policy(tiny_llama, policy, pad):
    prompts = PROMPTS + [SYSTEM[:8] + [7, 8, 9], [5, 6, 7]]
    eng, cached = run(tiny_llama, prompts, caching=True, max_batch=2, policy=policy,
                      pad_finished=pad)
    _, plain = run(tiny_llama, prompts, caching=False, max_batch=2, policy=policy,
                   pad_finished=pad)
    assert [s.output_ids for s in cached] == [s.output_ids for s in plain]
    assert eng.block_manager.num_hit_tokens > 0
