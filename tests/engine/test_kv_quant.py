"""mini_engine's 8-bit KV cache (task 14, mini_engine/kv_quant.py): the arithmetic of a token's
bytes and the pages a budget buys, exact; what a write and a read give back, within the format's
precision; scales that stay with their slot; the C write and read (kernels/kv_quant.py's
CQuantizedPool) giving the torch way's bits; the settings it refuses; and the bound on greedy
output and log-probabilities it keeps on the tiny model, measured there and stated below. The
property tests (test_engine_properties.py) draw it on every path of a step, with each kernels
setting: there a request's tokens with an 8-bit cache are the ones it makes alone with the same
cache, the torch way."""
from __future__ import annotations

import pytest
import torch

from lessons.task_14 import quality as q
from mini_engine import EngineConfig, LLMEngine
from mini_engine.kernels import build
from mini_engine.kernels import kv_quant as c_kv
from mini_engine.kernels.kv_quant import CQuantizedPool
from mini_engine.kv_quant import KV_CACHE_DTYPES, QuantizedPool, bytes_per_token, dequantize

SMOL = (30, 3, 64)      # SmolLM2-135M: layers, KV heads, head_dim


@pytest.mark.parametrize("kv, dtype, expected", [
    (("auto", "token"), torch.bfloat16, 23_040),      # 2 x 30 x 3 x 64 x 2 B
    (("auto", "token"), torch.float32, 46_080),
    (("fp8", "layer"), torch.bfloat16, 11_520),       # the layer's two scales are no token's
    (("fp8", "token"), torch.bfloat16, 11_880),       # + 2 x 30 x 3 scales of 2 B
    (("fp8_e5m2", "token"), torch.float32, 11_880),   # the model's dtype changes no 8-bit byte
])
def test_a_tokens_bytes(kv, dtype, expected):
    assert bytes_per_token(*SMOL, *kv, dtype) == expected


def test_the_pages_a_budget_buys_count_the_scales(tiny_llama):
    """The engine's pages are the budget over a page's bytes, scales included; 128 MiB in pages
    of 32 holds for SmolLM 182 pages in bf16, 364 in fp8 with a scale a layer, 353 with a scale
    a token (test_task_14.py's hand record)."""
    budget = 1 << 20
    for kv in (("auto", "token"), ("fp8", "layer"), ("fp8", "token")):
        eng = q.engine(tiny_llama, [], kv, budget, 32, 64)
        per_token = bytes_per_token(tiny_llama.num_layers, tiny_llama.num_kv_heads,
                                    tiny_llama.head_dim, *kv, tiny_llama.dtype)
        assert eng.kv_bytes_per_token == per_token
        assert eng.num_pages == budget // (32 * per_token)
    assert [134_217_728 // (32 * bytes_per_token(*SMOL, *kv, torch.bfloat16)) for kv in
            (("auto", "token"), ("fp8", "layer"), ("fp8", "token"))] == [182, 364, 353]


def test_a_token_scale_keeps_each_head_within_the_formats_precision():
    """e4m3 keeps 3 bits of mantissa: a value read back is within 2^-4 of its head's largest
    magnitude (the rounding of a value at most that size), whatever the head's size; a second
    write elsewhere leaves the first slot's values and scales as they were."""
    gen = torch.Generator().manual_seed(0)
    pool = QuantizedPool.allocate(8, 3, 64, "fp8", "token")
    k = torch.randn(2, 3, 64, generator=gen) * torch.tensor([1e-3, 1.0, 500.0])[None, :, None]
    v = torch.randn(2, 3, 64, generator=gen)
    pool.write(torch.tensor([5, 2]), k, v)
    kept = pool.read(torch.tensor([5, 2]), torch.float32).clone()
    pool.write(torch.tensor([0]), k[:1] * 7, v[:1] * 7)
    assert torch.equal(pool.read(torch.tensor([5, 2]), torch.float32), kept)
    truth = torch.stack((k, v), dim=1)
    bound = truth.abs().amax(dim=-1, keepdim=True) * 2 ** -4
    assert ((kept - truth).abs() <= bound).all()


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_pair_table_reads_every_value_as_torch_converts_it(fp8, dtype):
    """dequantize looks values up two at a time: every pair of the 256 codes (NaNs aside, which
    a write never stores) reads back bit for bit as torch's own conversion gives it."""
    codes = torch.arange(256, dtype=torch.uint8)
    pairs = torch.stack(torch.meshgrid(codes, codes, indexing="ij"), dim=-1).reshape(-1, 2)
    raw = pairs.contiguous().view(fp8)
    keep = ~raw.to(torch.float32).isnan().any(dim=1)
    raw = raw[keep]
    assert torch.equal(dequantize(raw, dtype), raw.to(dtype))


def codes_and_ties(fp8: torch.dtype) -> torch.Tensor:
    """Every finite value of the format, every midpoint between two neighbours (where rounding to
    nearest even decides) and the floats either side of it, 2^18 random finite floats of every
    magnitude, and the edges: zeros, fp32 subnormals, past the range, huge."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8).float()
    codes = codes[codes.isfinite()].unique()
    ties = ((codes[1:].double() + codes[:-1].double()) / 2).float()
    near = [torch.nextafter(ties, torch.tensor(side)) for side in (1e9, -1e9)]
    torch.manual_seed(0)
    floats = torch.randint(-2**31, 2**31 - 1, (2**18,)).to(torch.int32).view(torch.float32)
    edges = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-12, 448.0, 449.0, 480.0, 57344.0, 6e4,
                          1e30, -1e30])
    return torch.cat([codes, ties, *near, floats[floats.isfinite()], edges])


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("scale", ["token", "layer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_write_in_one_pass_of_c_gives_torchs_bits(kv, scale, dtype):
    """kv_quant.c's write (CQuantizedPool) against torch's (QuantizedPool): the same codes and
    the same scales, bit for bit, for
    every code, every tie between two codes, random floats of every magnitude and the edges, in
    both formats, both scales and both of the model's dtypes; K and V given as the model gives
    them (slices of its projection's rows), written to slots out of order."""
    assert c_kv.available(), "this machine has a C compiler: the C is built"
    x = codes_and_ties(KV_CACHE_DTYPES[kv])
    rows = x.numel() // (5 * 64)
    qkv = x[:rows * 5 * 64].view(rows, 5, 64).to(dtype)     # 2 query heads, then K's 2, V's 1
    qkv[0, 2], qkv[1, 2] = 0.0, 1e-30      # heads whose scale is the smallest one, 1e-12
    k, v = qkv[:, 2:4], torch.cat([qkv[:, 4:], -qkv[:, 4:]], dim=1)
    slots = torch.randperm(rows + 7)[:rows]
    c = CQuantizedPool.allocate(rows + 7, 2, 64, kv, scale)
    torch_ = QuantizedPool.allocate(rows + 7, 2, 64, kv, scale)
    assert type(c) is CQuantizedPool and type(torch_) is QuantizedPool
    c.write(slots, k, v)
    torch_.write(slots, k, v)
    assert torch.equal(c.values.view(torch.uint8), torch_.values.view(torch.uint8))
    assert scale == "layer" or torch.equal(c.scales.view(torch.int16),
                                           torch_.scales.view(torch.int16))


@pytest.mark.parametrize("kv", ["fp8", "fp8_e5m2"])
@pytest.mark.parametrize("scale", ["token", "layer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_read_in_one_pass_of_c_gives_torchs_bits(kv, scale, dtype):
    """kv_quant.c's read against the same read in torch's four passes: every value of the pool,
    the format's subnormals and its largest among them, slots repeated and out of order, bit for
    bit, in both formats, both scales and both of the model's dtypes."""
    assert c_kv.available(), "this machine has a C compiler: the C is built"
    torch.manual_seed(0)
    pool = CQuantizedPool.allocate(256, 3, 64, kv, scale)
    k, v = torch.randn(2, 256, 3, 64) * torch.logspace(-6, 3, 256)[:, None, None]
    pool.write(torch.arange(256), k, v)
    if scale == "layer":    # every code a write can make (no NaN, no infinity), in some slot
        pool.values.view(torch.uint8)[:, 0, 0, 0] = torch.arange(256, dtype=torch.uint8)
        pool.values.view(torch.uint8)[~pool.values.float().isfinite()] = 0
    slots = torch.cat([torch.randperm(256), torch.tensor([5, 5, 0, 255])])
    fused, four = pool.read(slots, dtype), QuantizedPool.read(pool, slots, dtype)
    assert fused.dtype == four.dtype == dtype and fused.shape == four.shape == (260, 2, 3, 64)
    assert torch.equal(fused.view(torch.uint8), four.view(torch.uint8))


@pytest.mark.parametrize("slots, bad", [([0, 8], 8), ([-1], -1), ([3, 9, -2], 9)])
def test_a_slot_outside_the_pool_is_an_error_not_a_crash(slots, bad):
    """The C checks every slot before it touches the pool: the first bad one is an IndexError,
    and a write that is refused writes nothing."""
    pool = CQuantizedPool.allocate(8, 1, 64, "fp8", "token")
    before = pool.values.view(torch.uint8).clone(), pool.scales.clone()
    with pytest.raises(IndexError, match=f"slot {bad} out of the pool's 8"):
        pool.read(torch.tensor(slots), torch.bfloat16)
    kv = torch.ones(len(slots), 1, 64)
    with pytest.raises(IndexError, match=f"slot {bad} out of the pool's 8"):
        pool.write(torch.tensor(slots), kv, kv)
    assert torch.equal(pool.values.view(torch.uint8), before[0])
    assert torch.equal(pool.scales, before[1])


def test_without_a_c_compiler_torch_writes_and_reads(tiny_llama, monkeypatch):
    """No compiler (CC, where set, is the only one tried): no library; kernels/kv_quant.py is not
    available, and an engine asked for kernels "c" allocates the torch way's QuantizedPool, says
    so, and makes the tokens of the engine with the C pool (the same bits)."""
    monkeypatch.setenv("CC", "/nonexistent")
    assert build.library.__wrapped__("kv_quant.c") is None
    budget = 64 * 16 * tiny_llama.kv_bytes_per_token
    config = EngineConfig(kv_bytes=budget, max_batch=2, kv_cache_dtype="fp8", kernels="c")
    prompts = [[(5 * i + j) % 900 + 1 for j in range(n)] for i, n in enumerate([7, 21])]
    tokens = {}
    for built in (True, False):
        if not built:
            monkeypatch.setattr(c_kv, "_library", lambda: None)
            assert not c_kv.available()
        eng = LLMEngine(tiny_llama, [], config)
        assert type(eng.kv_cache[0]) is (CQuantizedPool if built else QuantizedPool)
        assert eng.kernels_used()["8-bit cache"] == ("C" if built else "torch")
        seqs = [eng.add_request(p, 8, min_tokens=8) for p in prompts]
        eng.run()
        tokens[built] = [s.output_ids for s in seqs]
    assert tokens[True] == tokens[False]


def test_a_layer_scale_of_one_clamps_and_loses_small_values():
    """vLLM's uncalibrated case: values past +-448 are clamped to it; values below e4m3's
    smallest subnormal (2^-9) read back as 0."""
    pool = QuantizedPool.allocate(2, 1, 4, "fp8", "layer")
    k = torch.tensor([[[1000.0, -1000.0, 1e-4, 1.0]]])
    pool.write(torch.tensor([1]), k, k)
    assert pool.read(torch.tensor([1]), torch.float32)[0, 0, 0].tolist() == [448, -448, 0, 1]


def test_the_settings_it_refuses(tiny_llama):
    budget = 64 * 16 * tiny_llama.kv_bytes_per_token
    with pytest.raises(ValueError, match="kv_cache_dtype 'int8'"):
        EngineConfig(kv_bytes=budget, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kv_scale 'page'"):
        EngineConfig(kv_bytes=budget, kv_cache_dtype="fp8", kv_scale="page")
    with pytest.raises(ValueError, match="8-bit KV cache"):
        EngineConfig(kv_bytes=budget, kv_cache_dtype="fp8", kernels="compiled")


# Measured on the tiny model (fp32, the property tests' small vocabulary; AMD EPYC, 2026-12-01):
# the passage below changed its log-probabilities by 0.0034 on average with fp8 and a scale a
# token, 0.0036 with one scale a layer (e5m2: 0.0063 and 0.0069). The bound stated, with room:
BOUND_TOKEN = 0.005


def test_a_scale_a_token_keeps_the_log_probabilities_within_its_bound(tiny_llama):
    """The passage (ids 1..199 of the tiny vocabulary), teacher-forced through each cache: a
    scale a token changes its log-probabilities by at most BOUND_TOKEN on average, less than one
    scale a layer does."""
    ids = [(7 * i) % 1000 + 1 for i in range(200)]
    base = q.passage_logprobs(tiny_llama, ids, ("auto", "token"), 32)
    token = q.mean_abs_change(base, q.passage_logprobs(tiny_llama, ids, ("fp8", "token"), 32))
    layer = q.mean_abs_change(base, q.passage_logprobs(tiny_llama, ids, ("fp8", "layer"), 32))
    assert token <= BOUND_TOKEN and token < layer
