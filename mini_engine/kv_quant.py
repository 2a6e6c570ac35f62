"""The KV cache in 8 bits: half the bytes a token, and the scales that make it usable.

A token's K and V cost 2 x layers x kv_heads x head_dim values; SmolLM2-135M stores 11,520 of
them, 23,040 B in bf16. Stored as fp8 they take 11,520 B, and the same budget holds about twice
the tokens. An 8-bit float keeps 3 bits of mantissa (e4m3, vLLM's "fp8") or 2 (e5m2) and a range
of +-448 (e4m3) or +-57,344 (e5m2), so each value is stored divided by a scale and multiplied
back when read. Where the scale lives is the design (EngineConfig.kv_scale):

    "layer"   one scale a layer for K and one for V, 1.0: what vLLM does on a CPU for a checkpoint
              without calibrated scales (vllm/model_executor/layers/quantization/kv_cache.py).
              A value outside the format's range is clamped to it; a small one loses digits.
    "token"   one scale for each token's K and V in each KV head (2 x layers x kv_heads of them),
              computed when the token is written: its largest magnitude over the head's 64
              dims maps to the format's largest value (nano-vllm's kv_quant.py keeps int8 with
              the same granularity). Each scale is stored in bf16, 2 B: SmolLM's 180 scales a
              token cost 360 B: a token costs 11,880 B, 1.94x the tokens of bf16 in a budget.

Why fp8 and not int8: vLLM's CPU cache offers fp8 (e4m3 and e5m2) and no int8, and with one
format in both engines the scale's granularity is the only thing that changes between them. An
int8 value with a scale of 1.0, vLLM's uncalibrated case, would round K and V to whole numbers.

The pools: one QuantizedPool a layer, values [slots, 2 (K, V), kv_heads, head_dim] in fp8 and,
with "token", scales [slots, 2, kv_heads] in bf16, the scales beside the values of the same
slot, so that a page keeps its scales wherever it is shared, rolled back or reused. Attention
writes through write() and reads a context back through read(): the gather reads 8-bit values,
and only the context being attended is turned back into the model's dtype (dequantizing the
whole pool each step would cost a pass over every page). kernels/kv_quant.py does the write and
the read each in one pass of C, with the same bits (tests/engine/test_kv_quant.py).
"""
from __future__ import annotations

import functools

import torch

KV_CACHE_DTYPES = {"auto": None, "fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
KV_SCALES = ("layer", "token")
SCALE_DTYPE = torch.bfloat16


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype K and V are stored in: the model's ("auto"), or an 8-bit float."""
    return KV_CACHE_DTYPES[kv_cache_dtype] or model_dtype


def bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, kv_cache_dtype: str,
                    kv_scale: str, model_dtype: torch.dtype) -> int:
    """A token's K and V in every layer, their scales included: SmolLM2-135M bf16 23,040 B,
    fp32 46,080, fp8 with one scale a layer 11,520 (the layer's two scales are not a token's),
    fp8 with a scale a token and head 11,520 + 360 = 11,880."""
    values = 2 * num_layers * kv_heads * head_dim * storage_dtype(kv_cache_dtype,
                                                                  model_dtype).itemsize
    scaled = kv_cache_dtype != "auto" and kv_scale == "token"
    return values + (2 * num_layers * kv_heads * SCALE_DTYPE.itemsize if scaled else 0)


class QuantizedPool:
    """One layer's 8-bit K and V, and their scales (None: one scale a layer, 1.0)."""
    def __init__(self, values: torch.Tensor, scales: torch.Tensor | None):
        self.values = values        # (slots, 2, kv_heads, head_dim), fp8
        self.scales = scales        # (slots, 2, kv_heads), bf16; None with kv_scale "layer"
        self.largest = torch.finfo(values.dtype).max       # 448 (e4m3) or 57,344 (e5m2)

    @classmethod
    def allocate(cls, num_slots: int, kv_heads: int, head_dim: int, kv_cache_dtype: str,
                 kv_scale: str) -> "QuantizedPool":
        values = torch.zeros(num_slots, 2, kv_heads, head_dim,
                             dtype=KV_CACHE_DTYPES[kv_cache_dtype])
        scales = (torch.ones(num_slots, 2, kv_heads, dtype=SCALE_DTYPE) if kv_scale == "token"
                  else None)
        return cls(values, scales)

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the rows' K and V (T, kv_heads, head_dim) at their slots, in 8 bits."""
        kv = torch.stack((k, v), dim=1).float()                           # (T, 2, KVH, D)
        if self.scales is not None:
            # the head's largest magnitude maps to the format's largest value; an all-zero
            # head gets a tiny scale instead of 0 (no division by zero; it reads back as 0)
            scale = (kv.abs().amax(dim=-1) / self.largest).clamp_min(1e-12).to(SCALE_DTYPE)
            kv = kv / scale.float()[..., None]     # divided by the scale stored, as it is read
            self.scales.index_copy_(0, slots, scale)
        quantized = kv.clamp(-self.largest, self.largest).to(self.values.dtype)
        # index_copy_ has no fp8 kernel on a CPU: the bytes are copied as bytes
        self.values.view(torch.uint8).index_copy_(0, slots, quantized.view(torch.uint8))

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The K and V at these slots, (n, 2, kv_heads, head_dim), back in dtype: gather,
        values, scales, multiply."""
        raw = self.values.index_select(0, slots)             # 8-bit rows: half bf16's bytes
        kv = dequantize(raw, dtype)
        if self.scales is not None:
            kv = kv * self.scales.index_select(0, slots).to(dtype)[..., None]
        return kv


@functools.cache
def pair_table(fp8: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """Every pair of 8-bit values (65,536 of them, as one 16-bit code) -> the pair in dtype, each
    pair one integer of twice dtype's width: 256 KB for bf16, 512 KB for fp32."""
    codes = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    pairs = codes.view(torch.uint8).view(fp8).to(dtype)
    return pairs.view({2: torch.int32, 4: torch.int64}[dtype.itemsize])


def dequantize(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """8-bit values (last dim even) in dtype, two at a time through pair_table: torch's own
    conversion (raw.to(dtype)) runs value by value, several times slower (docs/measurements.md).
    The result is bit for bit the conversion's (tests/engine/test_kv_quant.py)."""
    codes = raw.view(torch.int16).int() & 0xFFFF            # the pair's two bytes, unsigned
    table = pair_table(raw.dtype, dtype)
    return table.index_select(0, codes.flatten()).view(dtype).view(raw.shape)
