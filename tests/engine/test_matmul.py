"""mini_engine's own product for a step's few rows (mini_engine/kernels/matmul.c, the packed way
"matmul.c" of kernels/linear.py): the exact product rounded once to bfloat16, on every shape of
tile it runs (1 to 6 rows, 1 to 4 blocks of 16 columns, a last block cut short, an odd number of
features); q, k and v packed as one weight; the inputs it refuses; where it does not work; and,
on the tiny model, the same logits as F.linear's within bfloat16's rounding. Its speed is
measured by kernels/linear.py's for_model and by task 13, never here."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common import settings
from mini_engine import Llama
from mini_engine.kernels import linear as lin
from mini_engine.model import RequestChunk, make_batch


needs_bf16_dot = pytest.mark.skipif("avx512_bf16" not in settings.cpu_flags(),
                                    reason="the CPU has no AVX512_BF16: matmul.c's kernel is off")
C = next(way for way in lin.WAYS if way.name == "matmul.c")


def product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T through matmul.c, the weight packed first."""
    return lin.c_matmul(x, lin.c_pack(weight))


@needs_bf16_dot
def test_it_works_in_bfloat16_only():
    """Where the CPU has the instruction (and this machine has a compiler), it is built and
    works, in bfloat16; in float32 it does not (it multiplies bfloat16 pairs only)."""
    assert lin.works(C, torch.bfloat16)
    assert not lin.works(C, torch.float32)


@needs_bf16_dot
@pytest.mark.parametrize("in_features", [2, 18, 17, 576])
@pytest.mark.parametrize("out_features", [16, 40, 64, 80, 96, 112, 200])
def test_the_product_is_the_exact_one_rounded_once(in_features, out_features):
    """Every row count from 1 to 13 (tiles of 1-6 rows, and 6 + 6 + 1), a prefill's rows in
    groups of 48 (50: 48 + 2; 101: 48 + 48 + 5, its last tile cut short in its group), every
    number of blocks in a panel (64 columns: 4 blocks; 80, 96, 112: a last panel of 1, 2, 3), a
    last block cut short (40, 200), an odd K (padded with a zero feature). Against float64:
    within half a unit of bfloat16's last place (the one rounding) plus float32's error over K
    additions."""
    gen = torch.Generator().manual_seed(in_features * 1000 + out_features)
    w = torch.randn(out_features, in_features, generator=gen).to(torch.bfloat16)
    packed = lin.c_pack(w)
    for rows in [*range(1, 14), 50, 101]:
        x = torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
        y = lin.c_matmul(x, packed)
        assert y.shape == (rows, out_features) and y.dtype == torch.bfloat16
        exact = x.double() @ w.double().T
        bound = exact.abs() * 2.0 ** -8 + (x.double().abs() @ w.double().abs().T) * 2e-6
        assert ((y.double() - exact).abs() <= bound).all(), (rows, in_features, out_features)


@needs_bf16_dot
def test_fused_parts_give_each_parts_product():
    """q, k and v packed as one weight (as the model stacks them, DecoderLayer.qkv): each part's
    columns are its own product, bit for bit."""
    torch.manual_seed(0)
    parts = [torch.randn(n, 64).to(torch.bfloat16) for n in (128, 64, 64)]
    x = torch.randn(5, 64).to(torch.bfloat16)
    fused = product(x, torch.cat(parts))
    assert torch.equal(fused, torch.cat([product(x, p) for p in parts], dim=1))
    assert torch.equal(fused[:, 128:192], product(x, parts[1]))


@needs_bf16_dot
def test_it_refuses_what_it_cannot_multiply():
    packed = lin.c_pack(torch.randn(32, 16).to(torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16 only"):
        lin.c_matmul(torch.randn(3, 16), packed)
    with pytest.raises(ValueError, match="x has 18 features, the weight 16"):
        lin.c_matmul(torch.randn(3, 18).to(torch.bfloat16), packed)


def test_without_the_library_it_does_not_work(monkeypatch):
    """No compiler, or a CPU without AVX512_BF16 (matmul_bf16_supported 0): it does not work
    here, and for_model times the others only."""
    monkeypatch.setattr(lin, "_library", lambda: None)
    assert not lin.works(C, torch.bfloat16)


@needs_bf16_dot
def test_the_tiny_model_gives_f_linears_logits(small_vocab_model):
    """Every linear layer of the tiny model in bfloat16 through the C (Llama.forward's linear):
    its logits on a prefill of 12 tokens and a decode row are F.linear's within bfloat16's
    rounding of a 2-layer forward."""
    m = Llama(small_vocab_model, "bfloat16")
    packed = {w.data_ptr(): lin.c_pack(w) for w in m.linear_weights()}
    products = {"F.linear": F.linear,
                "matmul.c": lambda x, w: lin.c_matmul(x, packed[w.data_ptr()])}
    logits = {}
    for name, linear in products.items():
        pool = [torch.zeros(m.kv_cache_shape(2, 16), dtype=m.dtype) for _ in m.layers]
        first = make_batch([RequestChunk(list(range(3, 15)), 0, [0])], 16, m.heads_per_kv,
                           m.dtype)
        second = make_batch([RequestChunk([7], 12, [0])], 16, m.heads_per_kv, m.dtype)
        with torch.inference_mode():
            logits[name] = torch.cat([m.forward(first, pool, linear=linear),
                                      m.forward(second, pool, linear=linear)])
    diff = (logits["matmul.c"] - logits["F.linear"]).abs().max().item()
    scale = logits["F.linear"].abs().max().item()
    assert diff <= 0.03 * scale, (diff, scale)
    assert F.cosine_similarity(logits["matmul.c"], logits["F.linear"]).min() > 0.999


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_benchmark_times_every_way_that_works_on_the_same_products(dtype):
    """benchmarks/linear_ways.py's ways: F.linear, each of kernels/linear.py's ways that works
    here (the same functions the engine runs), inductor's frozen module (compiled on first call,
    so not called here); each way's pass gives F.linear's products."""
    from benchmarks.linear_ways import ways

    ws = [torch.randn(48, 32).to(dtype), torch.randn(20, 48).to(dtype)]
    xs = [torch.randn(3, 32).to(dtype), torch.randn(3, 48).to(dtype)]
    found = ways(ws, dtype)
    working = [w.name for w in lin.WAYS if lin.works(w, dtype)]
    assert list(found) == ["F.linear", *working, "inductor frozen"]
    reference = found["F.linear"](xs)
    for name in ["F.linear", *working]:
        outs = found[name](xs)
        assert [o.shape for o in outs] == [(3, 48), (3, 20)], name
        for out, ref in zip(outs, reference):
            assert torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2), name
