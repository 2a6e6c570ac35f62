"""mini_engine's attention in one pass of C (task 13, mini_engine/kernels/paged_attention.c,
wrapped by kernels/attention.py): the same output as its torch reference, gathering the pages
and attending with torch's SDPA, within float32's rounding, for decode rows on contexts of every
length around its blocks of 16 (so its running softmax is rescaled many times over) and for
prefill rows, fresh and continued; each request's output the same bits whatever else is in the
batch; the torch way's calls and query pieces attending as one call does; the cases it refuses
and where it cannot be built; and, on the tiny model, the engine's greedy tokens the same with
the kernels and without. The property searches (test_engine_properties.py) draw
EngineConfig.kernels; test_engine.py runs task 9 with its default, kernels "c"."""
from __future__ import annotations

import random

import pytest
import torch

from mini_engine import EngineConfig, LLMEngine, Llama
from mini_engine.kernels import attention
from mini_engine.kernels.attention import in_place_groups
from mini_engine.kv_quant import QuantizedPool
from mini_engine.model import RequestChunk, make_batch

PAGE = 16
# context lengths: one position, one short of a block, a block, one past it, many blocks, and a
# context whose largest score comes late (the running maximum grows block after block: below)
LENGTHS = [1, 15, 16, 17, 100, 300]


def decode_step(lengths: list[int], heads: int, kv_heads: int, dim: int, dtype: torch.dtype,
                seed: int = 0):
    """q, k, v of one decode row a request, a pool holding every request's context on pages
    scattered over it, each request's chunk, and the step's batch, in place (True) and gathered
    (False)."""
    gen = torch.Generator().manual_seed(seed)
    pages_each = [-(-n // PAGE) for n in lengths]
    order = list(range(sum(pages_each) + 3))
    random.Random(seed).shuffle(order)
    tables, at = [], 0
    for n in pages_each:
        tables.append(order[at:at + n])
        at += n
    pool = torch.randn(len(order), PAGE, 2, kv_heads, dim, generator=gen).to(dtype)
    # scores that grow along the context, so the largest comes in the last block
    ramp = torch.linspace(0, 3, PAGE * len(order)).view(len(order), PAGE, 1, 1)
    pool[:, :, 0] *= (1 + ramp).to(dtype)
    q = torch.randn(len(lengths), heads, dim, generator=gen).to(dtype)
    k, v = torch.randn(2, len(lengths), kv_heads, dim, generator=gen).to(dtype)
    chunks = [RequestChunk([0], n - 1, t) for n, t in zip(lengths, tables)]
    batches = {way: make_batch(chunks, PAGE, heads // kv_heads, dtype,
                               in_place=in_place_groups if way else None)
               for way in (True, False)}
    return q, k, v, pool, chunks, batches


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads, kv_heads, dim", [(9, 3, 64), (2, 2, 32), (8, 1, 128)])
def test_in_place_gives_sdpas_output(dtype, tolerance, heads, kv_heads, dim):
    """The C against the gather and SDPA, every request at once: the largest difference within
    float32's rounding in float32 (a few units in the sixth digit, as SDPA's own blocks add in
    their own order), and within bfloat16's last bit in bfloat16 (both round once at the end)."""
    assert attention.kernel() is not None, "this machine has a C compiler: it is built"
    q, k, v, pool, _, batches = decode_step(LENGTHS, heads, kv_heads, dim, dtype)
    assert [g.in_place for g in batches[True].groups] == [True]
    assert not any(g.in_place for g in batches[False].groups)
    shape = dict(num_heads=heads, num_kv_heads=kv_heads, head_dim=dim)
    outs = {way: attend(shape, q, k, v, batches[way], pool.clone()) for way in (True, False)}
    assert outs[True].dtype == dtype and outs[True].shape == (len(LENGTHS), heads * dim)
    scale = outs[False].abs().max().item()
    assert (outs[True].float() - outs[False].float()).abs().max().item() <= tolerance * scale


def attend(shape: dict, q, k, v, batch, pool) -> torch.Tensor:
    """Llama.attention without a model: it reads only the head counts."""
    stand_in = type("Shape", (), shape)()
    return Llama.attention(stand_in, q, k, v, batch, pool)


def test_a_request_gets_the_same_bits_whatever_its_neighbours():
    """Each request alone, then all of them in one batch: bit for bit the same output (the
    engine's property tests rely on it: a request's tokens are its tokens alone)."""
    q, k, v, pool, chunks, batches = decode_step(LENGTHS, 9, 3, 64, torch.float32)
    shape = dict(num_heads=9, num_kv_heads=3, head_dim=64)
    together = attend(shape, q, k, v, batches[True], pool.clone())
    for i, chunk in enumerate(chunks):
        alone = make_batch([chunk], PAGE, 3, torch.float32, in_place=in_place_groups)
        out = attend(shape, q[i:i + 1], k[i:i + 1], v[i:i + 1], alone, pool.clone())
        assert torch.equal(out[0], together[i])


def test_the_torch_ways_bounded_calls_attend_as_one_call():
    """Gathered (the torch way), a decode batch whose contexts add up to more than call_slots
    padded slots attends in several calls, each request in exactly one: the same output as one
    call for the whole batch, within float32's rounding (SDPA pads each call to its own
    longest context)."""
    q, k, v, pool, chunks, _ = decode_step(LENGTHS, 9, 3, 64, torch.float32)
    shape = dict(num_heads=9, num_kv_heads=3, head_dim=64)
    bounded = make_batch(chunks, PAGE, 3, torch.float32, call_slots=600)
    whole = make_batch(chunks, PAGE, 3, torch.float32, call_slots=1 << 30)
    assert not any(g.in_place for g in bounded.groups) and len(bounded.groups) > 1
    assert len(whole.groups) == 1
    assert sorted(torch.cat([g.out_rows for g in bounded.groups]).tolist()) == \
        list(range(len(LENGTHS)))
    assert all(g.num_requests == 1 or g.num_requests * g.context_len <= 600
               for g in bounded.groups)
    outs = [attend(shape, q, k, v, b, pool.clone()) for b in (bounded, whole)]
    scale = outs[1].abs().max().item()
    assert (outs[0] - outs[1]).abs().max().item() <= 2e-6 * scale


def test_where_the_c_cannot_be_built_the_engine_gathers(tiny_llama, monkeypatch):
    """No library (no compiler): the C takes no model, an engine asked for kernels "c" makes
    its batches the torch way and says so, and a group made in place refuses to run."""
    q, k, v, pool, chunks, _ = decode_step(LENGTHS, 9, 3, 64, torch.float32)
    monkeypatch.setattr(attention, "kernel", lambda: None)
    assert not attention.takes(torch.float32, 9, 3, 64)
    eng = LLMEngine(tiny_llama, [], EngineConfig(
        kv_bytes=64 * PAGE * tiny_llama.kv_bytes_per_token, kernels="c"))
    assert eng.in_place is None
    assert eng.kernels_used()["attention"] == "torch, gathered + SDPA"
    batch = eng.batch_of(chunks[:2])
    assert not any(g.in_place for g in batch.groups)
    in_place = make_batch(chunks, PAGE, 3, torch.float32, in_place=in_place_groups)
    with pytest.raises(ValueError, match="make the batch without it"):
        attend(dict(num_heads=9, num_kv_heads=3, head_dim=64), q, k, v, in_place, pool)


def prefill_step(dtype: torch.dtype = torch.float32):
    """Prefill rows (fresh prompts, and chunks that go on with one: a start past 0) and decode
    rows, on pages of 8: q, k, v, the pool and the chunks."""
    gen, page = torch.Generator().manual_seed(1), 8
    starts_lens = [(0, 70), (0, 3), (40, 90), (13, 1), (0, 1)]   # (start_pos, tokens)
    tables, used = [], 0
    for start, n in starts_lens:
        tables.append(list(range(used, used + -(-(start + n) // page))))
        used += len(tables[-1])
    chunks = [RequestChunk([0] * n, start, t) for (start, n), t in zip(starts_lens, tables)]
    rows = sum(n for _, n in starts_lens)
    pool = torch.randn(used, page, 2, 3, 64, generator=gen).to(dtype)
    q = torch.randn(rows, 9, 64, generator=gen).to(dtype)
    k, v = torch.randn(2, rows, 3, 64, generator=gen).to(dtype)
    return q, k, v, pool, chunks, page


SMOL = dict(num_heads=9, num_kv_heads=3, head_dim=64)


@pytest.mark.parametrize("query_chunk", [1, 5, 64])
def test_a_prefill_in_pieces_attends_as_it_does_whole(query_chunk):
    """Gathered (the torch way), prefill rows attend in pieces of at most query_chunk
    queries, each over the context up to its own last position: the same output as each prompt
    whole, within float32's rounding; every piece within query_chunk, and every row in exactly
    one piece."""
    q, k, v, pool, chunks, page = prefill_step()
    rows = q.shape[0]
    whole = make_batch(chunks, page, 3, torch.float32, query_chunk=1 << 30)
    cut = make_batch(chunks, page, 3, torch.float32, query_chunk=query_chunk)
    assert not any(g.in_place for g in cut.groups)
    assert max(g.num_queries for g in cut.groups) == min(query_chunk, 90)
    assert sorted(torch.cat([g.out_rows for g in cut.groups]).tolist()) == list(range(rows))
    outs = [attend(SMOL, q, k, v, b, pool.clone()) for b in (whole, cut)]
    scale = outs[0].abs().max().item()
    assert (outs[0] - outs[1]).abs().max().item() <= 2e-6 * scale


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)])
def test_every_row_in_place_gives_sdpas_output(dtype, tolerance):
    """Prefill and decode rows together in one in-place group, in the rows' order, each over its
    context up to its own position: SDPA's output over the gathered pages (the prompts whole),
    within float32's rounding, and within bfloat16's last bit."""
    q, k, v, pool, chunks, page = prefill_step(dtype)
    rows = q.shape[0]
    in_place = make_batch(chunks, page, 3, dtype, in_place=in_place_groups)
    (group,) = in_place.groups
    assert group.in_place and group.rows.tolist() == list(range(rows))
    assert group.out_rows is group.rows
    # each row attends up to itself: the 70-token prompt's rows 1..70, the continued chunk's
    # 41..130
    assert group.context_lens[:70].tolist() == list(range(1, 71))
    assert group.context_lens[73:163].tolist() == list(range(41, 131))
    assert group.requests.tolist() == [0] * 70 + [1] * 3 + [2] * 90 + [3, 4]
    gathered = make_batch(chunks, page, 3, dtype, query_chunk=1 << 30)
    outs = [attend(SMOL, q, k, v, b, pool.clone()) for b in (in_place, gathered)]
    scale = outs[1].float().abs().max().item()
    assert (outs[0].float() - outs[1].float()).abs().max().item() <= tolerance * scale


def test_a_batch_made_in_place_refuses_a_pool_the_c_cannot_read():
    """An 8-bit pool (task 14) or a model's dtype the C does not take: one clear error, never a
    wrong answer (the engine makes no in-place group for them)."""
    q, k, v, pool, chunks, page = prefill_step()
    batch = make_batch(chunks, page, 3, torch.float32, in_place=in_place_groups)
    eight_bits = QuantizedPool.allocate(pool.shape[0] * page, 3, 64, "fp8", "token")
    with pytest.raises(ValueError, match="make the batch without it"):
        attend(SMOL, q, k, v, batch, eight_bits)
    with pytest.raises(ValueError, match="make the batch without it"):
        attend(SMOL, q.half(), k.half(), v.half(), batch, pool.half())


def test_the_engine_makes_the_same_tokens_every_way(tiny_llama):
    """The tiny model in float32, prompts of 5 to 60 tokens and 24 tokens each (contexts of up to
    five blocks): with the kernels (every row in place) and the torch way (every row gathered)
    the same greedy tokens, with prefill, chunks and preemption in between; the torch way makes
    no in-place group."""
    prompts = [[(7 * i + j) % 500 + 1 for j in range(n)] for i, n in enumerate([5, 17, 33, 60])]
    tokens = {}
    for kernels in ("c", "torch"):
        eng = LLMEngine(tiny_llama, [], EngineConfig(
            kv_bytes=24 * 4 * tiny_llama.kv_bytes_per_token, page_size=4, max_batch=4,
            max_num_batched_tokens=32, max_model_len=96, kernels=kernels))
        assert eng.in_place is (in_place_groups if kernels == "c" else None)
        made = []
        original = eng.batch_of
        eng.batch_of = lambda chunks: made.append(original(chunks)) or made[-1]
        seqs = [eng.add_request(p, 24, min_tokens=24) for p in prompts]
        eng.run()
        tokens[kernels] = [s.output_ids for s in seqs]
        assert eng.scheduler.num_preemptions > 0
        assert {g.in_place for b in made for g in b.groups} == {kernels == "c"}
    assert tokens["c"] == tokens["torch"]
