"""Attention that reads each request's pages where they are: paged_attention.c, beside its torch
reference, Llama.attention's gather and SDPA (mini_engine/model.py).

The torch way copies every context position's K and V out of its page, pads the contexts of a
call to its longest, and masks what a query must not see. The C walks each row's own context
through its page table, one query at a time, with a running softmax, as vLLM's CPU kernel does:
nothing copied, padded or masked, so a prefill is causal by its lengths. The engine uses it with
EngineConfig.kernels "c" or "compiled" (make_batch(..., in_place=in_place_groups)), where it takes
the model's shapes and the pool is the model's dtype; tests/engine/test_paged_attention.py holds
its outputs to the torch way's.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from mini_engine.kernels import build
from mini_engine.model import GroupMember, context_slots


@functools.cache
def kernel():
    """paged_attention.c's paged_attention, built for this machine, or None where it cannot be."""
    loaded = build.library("paged_attention.c")
    if loaded is None:
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    loaded.paged_attention.argtypes = [p, i64, p, p, p, p, i64, p, i64, i64, i64, i64,
                                       ctypes.c_float, i32, p, i32]
    loaded.paged_attention.restype = None
    return loaded.paged_attention


def takes(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the C is built here and takes a model of this dtype and these heads (its limits)."""
    return (kernel() is not None and dtype in (torch.float32, torch.bfloat16)
            and head_dim % 16 == 0 and head_dim <= 128 and num_heads // num_kv_heads <= 8
            and num_kv_heads <= 16)


@dataclass
class InPlaceGroup:
    """Every row of a step, in order, each one query over its own request's context up to its
    own position: what paged_attention.c reads."""
    rows: torch.Tensor           # (n,) the step's rows, in order
    requests: torch.Tensor       # (n,) each row's request: its row of context_slots
    context_slots: torch.Tensor  # (B*L,) pool slot of each request's context position
    context_len: int             # L, the longest context
    context_lens: torch.Tensor   # (n,) how far each row attends: its own position + 1
    in_place = True

    @property
    def out_rows(self) -> torch.Tensor:
        return self.rows

    def attend(self, q: torch.Tensor, pool: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
        """(n, H*D): each row's query (a row of q, (T, H, D)) over its context, read from the
        pool (Llama.kv_cache_shape) where it is."""
        _, H, D = q.shape
        if (not isinstance(pool, torch.Tensor) or not takes(q.dtype, H, num_kv_heads, D)
                or pool.dtype != q.dtype or q.stride(-1) != 1 or q.stride(-2) != D
                or not pool.is_contiguous()):
            raise ValueError(f"paged_attention.c does not take q {tuple(q.shape)} {q.dtype} over "
                             f"this pool ({type(pool).__name__}): make the batch without it")
        n = len(self.rows)
        out = q.new_empty(n, H * D)
        kernel()(q.data_ptr(), q.stride(0), self.rows.data_ptr(), self.requests.data_ptr(),
                 pool.data_ptr(), self.context_slots.data_ptr(), self.context_len,
                 self.context_lens.data_ptr(), n, num_kv_heads, H // num_kv_heads, D, D ** -0.5,
                 int(q.dtype == torch.bfloat16), out.data_ptr(), torch.get_num_threads())
        return out


def in_place_groups(members: list[GroupMember], page_size: int) -> list[InPlaceGroup]:
    """make_batch's in_place: every row of the step in one group, in the members' order."""
    if not members:
        return []
    counts = torch.tensor([m.num_queries for m in members])
    num_ctx = max(m.start_pos + m.num_queries for m in members)
    rows = torch.cat([torch.arange(m.first_row, m.first_row + m.num_queries) for m in members])
    lens = torch.cat([torch.arange(m.start_pos + 1, m.start_pos + m.num_queries + 1)
                      for m in members])
    return [InPlaceGroup(rows, torch.repeat_interleave(torch.arange(len(members)), counts),
                         context_slots(members, page_size, num_ctx).flatten(), num_ctx, lens)]
