"""The 8-bit KV cache's write and read in one pass of C each: kv_quant.c, beside its torch
reference, mini_engine/kv_quant.py's QuantizedPool.

torch writes a layer in about fourteen small operations and reads in four passes with three
copies; the C quantizes each row's heads straight into their slot, and turns each byte it gathers
into its value, scaled and rounded once, as vLLM's CPU kernel reads its fp8 pages. Both give the
same bits (tests/engine/test_kv_quant.py). The engine's kernels "c" allocate a CQuantizedPool.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from mini_engine.kernels import build
from mini_engine.kv_quant import QuantizedPool


@functools.cache
def _library() -> ctypes.CDLL | None:
    loaded = build.library("kv_quant.c")
    if loaded is None:
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    loaded.write_kv8.argtypes = [p, i64, p, i64, i32, p, i64, i64, i64, i64, p, p, i32,
                                 ctypes.c_float, i32]
    loaded.read_kv8.argtypes = [p, p, p, i64, i64, i64, i64, i32, i32, p, i32]
    loaded.write_kv8.restype = loaded.read_kv8.restype = i64
    return loaded


def available() -> bool:
    return _library() is not None


class CQuantizedPool(QuantizedPool):
    """A QuantizedPool whose write and read run kv_quant.c (torch's where a dtype is not the
    C's, or no slot is asked for)."""

    def __init__(self, values: torch.Tensor, scales: torch.Tensor | None):
        super().__init__(values, scales)
        # what the C is told about the pool on every call, worked out once: 30 layers a step
        self._c_pool = (values.view(torch.uint8).data_ptr(),
                        None if scales is None else scales.data_ptr(),
                        values.shape[0], int(values.dtype == torch.float8_e5m2))

    def write(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.dtype not in (torch.bfloat16, torch.float32) or not slots.numel():
            return super().write(slots, k, v)
        slots = slots.to(torch.int64).contiguous()
        # the C reads each row's heads as one run of kv_heads x head_dim values; a row may
        # start anywhere (k and v are slices of the projection's output rows)
        k, v = (x if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] else x.contiguous()
                for x in (k, v))
        values, scales, num_slots, e5m2 = self._c_pool
        _, _, heads, dim = self.values.shape
        self._raise_if_bad(slots, _library().write_kv8(
            k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), int(k.dtype == torch.bfloat16),
            slots.data_ptr(), slots.shape[0], num_slots, heads, dim, values, scales, e5m2,
            self.largest, torch.get_num_threads()))

    def read(self, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if dtype not in (torch.bfloat16, torch.float32) or not slots.numel():
            return super().read(slots, dtype)
        slots = slots.to(torch.int64).contiguous()
        _, kv, heads, dim = self.values.shape
        out = torch.empty(slots.shape[0], kv, heads, dim, dtype=dtype)
        values, scales, num_slots, e5m2 = self._c_pool
        self._raise_if_bad(slots, _library().read_kv8(
            values, scales, slots.data_ptr(), slots.shape[0], num_slots, kv * heads, dim, e5m2,
            int(dtype == torch.bfloat16), out.data_ptr(), torch.get_num_threads()))
        return out

    def _raise_if_bad(self, slots: torch.Tensor, bad: int) -> None:
        """The C checks every slot first and returns the first one outside the pool (-1: none):
        an IndexError, as torch's indexing raises."""
        if bad >= 0:
            raise IndexError(f"slot {int(slots[bad])} out of the pool's {self.values.shape[0]}")
