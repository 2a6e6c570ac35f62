"""The Llama forward of SmolLM in plain torch, with a paged KV cache: PagedAttention on a CPU.

Every token of a step, prefill and decode of different requests alike, is one row of x (T, C):
the linear layers run on all of them at once. Only attention needs to know which request a row
belongs to. Its K and V go into a pool of pages, [num_pages, page_size, 2 (K, V), kv_heads,
head_dim] per layer, through the slot mapping (vLLM's reshape_and_cache); each request then reads
its context back through its page table (vLLM's block table) and attends to it under a causal
mask. Every row of a step attends in one pass of C that reads each request's pages where they
are (paged_attention.c, EngineConfig.decode_in_place and prefill_in_place), as vLLM's CPU kernel
does: each row one query over its context up to its own position. Where the C cannot be built,
where the model's shapes are past its limits, or where the pool is in 8 bits, requests decoding
one token and requests prefilling several attend apart, as vLLM's attention backends split
decode from prefill (a decode step pads no query), each gathering its context and attending with
torch's SDPA, in calls of a bounded size (split_by_context). The pools
are not the model's: whoever runs it allocates them and hands them to forward, as vLLM's model
runner (nano-vllm's ModelRunner.allocate_kv_cache) keeps the KV cache beside the model, not in
it. A model that held them would be one pool shared by every engine built on it.

The weights come from the model folder's safetensors files (transformers' names, its formulas
for RMSNorm and RoPE, so the tokens match it exactly). The linear layers run F.linear until
choose_kernels measures, on this CPU, which way of handing them to the matmul library is fastest
(mini_engine/linear.py): the maths is the same, the speed is the machine's.
"""
from __future__ import annotations

import ctypes
import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mini_engine import linear as lin
from mini_engine import native
from mini_engine.config import EngineConfig
from mini_engine.kv_quant import QuantizedPool

if TYPE_CHECKING:
    from mini_engine.profiler import StepProfiler

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


# --- one step's inputs ---------------------------------------------------------------------------
class RequestChunk(NamedTuple):
    """The tokens one request computes in a step, from position start_pos, through its page
    table. write_slot None: their K/V goes into the request's pages; else all into that one slot
    (a padding row's scratch slot). num_logits: how many of its last rows' logits are wanted: 1
    for a token; 0 for a chunk that stops short of the request's last known token (no token
    comes of it); 1 + g for a decoding request's last token and its g guesses (speculative
    decoding: each row's logits check the guess after it)."""
    token_ids: list[int]
    start_pos: int
    page_table: list[int]
    write_slot: int | None = None
    num_logits: int = 1


class GroupMember(NamedTuple):
    """One request of an attention group: its rows [first_row, first_row + num_queries) of x."""
    first_row: int
    num_queries: int
    start_pos: int
    page_table: list[int]


@dataclass
class Group:
    """Requests that attend together: B requests of at most Q new tokens each, over contexts of at
    most L tokens. In place (in_place_group), every row of a step in one group, each over its own
    context, nothing padded. Gathered (make_group), decoding requests (Q = 1) attend apart from
    prefilling ones, each kind in groups of a bounded number of padded context slots
    (split_by_context)."""
    query_rows: torch.Tensor     # (B*Q,) row of each request's q-th new token (a shorter request
                                 # repeats its last row; those queries are computed, then
                                 # dropped); in place: (n,) the rows, in order
    context_slots: torch.Tensor  # (B*L,) pool slot of each request's context position
    mask: torch.Tensor | None    # (B, 1, G*Q, L) additive, one copy per query head of a KV head:
                                 # 0 where the query at position p sees context position <= p
    valid: torch.Tensor | None   # (n,) which of the B*Q queries are real (None: all of them)
    out_rows: torch.Tensor       # (n,) the row each real query's output goes to
    num_requests: int
    num_queries: int
    context_len: int
    context_lens: torch.Tensor   # (B,) each request's own context length (L is the longest);
                                 # in place: (n,) each row's, its own position + 1
    in_place: bool = False       # every row of it attends in paged_attention.c: query_rows and
                                 # out_rows are its rows, in order; no mask, nothing padded
    requests: torch.Tensor | None = None   # in place: (n,) each row's request, its slots' row


@dataclass
class Batch:
    """One step's inputs. T rows in all; B requests, the i-th owning rows [start_i, start_i + n_i)."""
    input_ids: torch.Tensor      # (T,)
    positions: torch.Tensor      # (T,) position of each row in its request
    slot_mapping: torch.Tensor   # (T,) pool slot each row's K/V is written to
    groups: list[Group]          # one in place (every row); or, gathered, decode and prefill
                                 # apart, each in calls of a bounded size
    logit_rows: torch.Tensor     # (S,) the rows whose logits are wanted: each request's last
                                 # num_logits rows (none for a chunk short of its prompt's end)
    num_rows: int


def context_slots(members: list[GroupMember], page_size: int, num_ctx: int) -> torch.Tensor:
    """(B, L): the pool slot of each request's context positions 0..L-1 (past a request's own
    context, a slot of its pages or page 0's: read by no query)."""
    # slot of context position p = page_table[p // page_size] * page_size + p % page_size
    num_pages = max(len(m.page_table) for m in members)
    tables = torch.tensor([m.page_table + [0] * (num_pages - len(m.page_table)) for m in members])
    ctx_pos = torch.arange(num_ctx)
    ctx_pages = torch.clamp(ctx_pos // page_size, max=num_pages - 1)
    return tables[:, ctx_pages] * page_size + ctx_pos % page_size


def make_group(members: list[GroupMember], page_size: int, heads_per_kv: int,
               dtype: torch.dtype) -> Group:
    """A call of SDPA over gathered pages: the members' queries padded to the longest, their
    contexts to the longest, a mask for both."""
    starts = torch.tensor([m.first_row for m in members])
    lengths = torch.tensor([m.num_queries for m in members])
    first_pos = torch.tensor([m.start_pos for m in members])
    num_q, num_ctx = int(lengths.max()), int((first_pos + lengths).max())
    slots = context_slots(members, page_size, num_ctx)                              # (B, L)
    ctx_pos = torch.arange(num_ctx)
    q_idx = torch.arange(num_q)
    valid = q_idx[None, :] < lengths[:, None]                                        # (B, Q)
    q_off = torch.minimum(q_idx[None, :], lengths[:, None] - 1)
    query_pos = first_pos[:, None] + q_off                                           # (B, Q)
    sees = ctx_pos[None, None, :] <= query_pos[:, :, None]                            # (B, Q, L)
    mask = torch.zeros(sees.shape, dtype=dtype).masked_fill_(~sees, float("-inf"))
    mask = mask.repeat(1, heads_per_kv, 1)[:, None]                        # (B, 1, G*Q, L)
    rows = starts[:, None] + q_off
    all_valid = bool(valid.all())
    return Group(rows.flatten(), slots.flatten(), mask,
                 None if all_valid else valid.flatten().nonzero().squeeze(1),
                 rows[valid], len(members), num_q, num_ctx, first_pos + lengths)


def in_place_group(members: list[GroupMember], page_size: int) -> Group:
    """Every row of these requests for paged_attention.c, in the members' order: each row a
    query over its own request's context up to its own position. A row's context length is
    where it stops, so nothing is padded or masked, and a prefill is causal by its lengths."""
    counts = torch.tensor([m.num_queries for m in members])
    num_ctx = max(m.start_pos + m.num_queries for m in members)
    rows = torch.cat([torch.arange(m.first_row, m.first_row + m.num_queries) for m in members])
    lens = torch.cat([torch.arange(m.start_pos + 1, m.start_pos + m.num_queries + 1)
                      for m in members])
    return Group(rows, context_slots(members, page_size, num_ctx).flatten(), None, None, rows,
                 len(members), int(counts.max()), num_ctx, lens, in_place=True,
                 requests=torch.repeat_interleave(torch.arange(len(members)), counts))


def split_by_context(members: list[GroupMember], call_slots: int) -> list[list[GroupMember]]:
    """Members in calls of at most call_slots padded context slots (a call's requests x its
    longest context; one request alone may have more), neighbours by context length so that
    little is padded. One call keeps the rows' own order. Why calls are bounded: config.py."""
    ends = [m.start_pos + m.num_queries for m in members]
    if not members or len(members) * max(ends) <= call_slots:
        return [members] if members else []
    parts: list[list[GroupMember]] = [[]]
    for end, m in sorted(zip(ends, members), key=lambda e: e[0]):
        if parts[-1] and (len(parts[-1]) + 1) * end > call_slots:
            parts.append([])
        parts[-1].append(m)
    return parts


def make_batch(chunks: list[RequestChunk], page_size: int, heads_per_kv: int = 1,
               dtype: torch.dtype = torch.float32,
               call_slots: int = EngineConfig.attention_call_slots,
               in_place: bool = EngineConfig.decode_in_place,
               query_chunk: int = EngineConfig.prefill_query_chunk,
               prefill_in_place: bool = EngineConfig.prefill_in_place) -> Batch:
    """Every request's chunk as rows of one batch, its K/V slots, and its attention groups.
    in_place: the decode requests attend in paged_attention.c, in one group (it pads nothing, so
    the group is not cut into calls); with prefill_in_place, every row does, all in one group in
    the rows' order. The caller asks for it only where the C takes the model (in_place_takes)
    and the pool is not in 8 bits. Where the library could not be built, decode requests are cut
    into calls of at most call_slots, as prefill requests always are when they gather.
    query_chunk: a gathered prefill's queries go into pieces of at most this many, each a member
    of its own, over the context up to its last position (why: config.py)."""
    rows_ids, rows_pos, rows_slot, members = [], [], [], []
    for chunk in chunks:
        members.append(GroupMember(len(rows_ids), len(chunk.token_ids), chunk.start_pos,
                                   chunk.page_table))
        rows_ids += chunk.token_ids
        for pos in range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids)):
            rows_pos.append(pos)
            rows_slot.append(chunk.page_table[pos // page_size] * page_size + pos % page_size
                             if chunk.write_slot is None else chunk.write_slot)
    in_place = in_place and in_place_kernel() is not None
    if in_place and prefill_in_place:
        groups = [in_place_group(members, page_size)] if members else []
    else:
        decode = [m for m in members if m.num_queries == 1]
        prefill = [GroupMember(m.first_row + q, min(query_chunk, m.num_queries - q),
                               m.start_pos + q, m.page_table)    # a prefill's queries in pieces
                   for m in members if m.num_queries > 1
                   for q in range(0, m.num_queries, query_chunk)]
        groups = ([in_place_group(decode, page_size)] if in_place and decode else
                  [make_group(part, page_size, heads_per_kv, dtype)
                   for part in split_by_context(decode, call_slots)])
        groups += [make_group(part, page_size, heads_per_kv, dtype)
                   for part in split_by_context(prefill, call_slots)]
    ends = torch.tensor([len(c.token_ids) for c in chunks]).cumsum(0).tolist()
    logit_rows = torch.tensor([row for c, end in zip(chunks, ends)
                               for row in range(end - c.num_logits, end)], dtype=torch.long)
    return Batch(torch.tensor(rows_ids), torch.tensor(rows_pos), torch.tensor(rows_slot),
                 groups, logit_rows, len(rows_ids))


# --- attention in one pass of C (paged_attention.c) -------------------------------------------
@functools.cache
def in_place_kernel():
    """paged_attention.c's paged_attention, built for this machine (native.py), or None where it
    cannot be: every group then gathers and attends with SDPA."""
    loaded = native.library("paged_attention.c")
    if loaded is None:
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    kernel = loaded.paged_attention
    kernel.argtypes = [p, i64, p, p, p, p, i64, p, i64, i64, i64, i64, ctypes.c_float, i32, p,
                       i32]
    kernel.restype = None
    return kernel


def in_place_takes(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether paged_attention.c takes a model of this dtype and these heads (its limits)."""
    return (in_place_kernel() is not None and dtype in (torch.float32, torch.bfloat16)
            and head_dim % 16 == 0 and head_dim <= 128 and num_heads // num_kv_heads <= 8
            and num_kv_heads <= 16)


def attend_in_place(q: torch.Tensor, g: Group, pool: torch.Tensor, num_kv_heads: int
                    ) -> torch.Tensor:
    """(n, H*D): each row's query (a row of q, (T, H, D)) over its request's context up to its
    own position, read from the pool (kv_cache_shape) where it is."""
    _, H, D = q.shape
    if (isinstance(pool, QuantizedPool) or not in_place_takes(q.dtype, H, num_kv_heads, D)
            or pool.dtype != q.dtype
            or q.stride(-1) != 1 or q.stride(-2) != D or not pool.is_contiguous()):
        raise ValueError(f"paged_attention.c does not take q {tuple(q.shape)} {q.dtype} over "
                         f"this pool ({type(pool).__name__}): make the batch with "
                         "in_place=False")
    n = len(g.query_rows)
    out = q.new_empty(n, H * D)
    in_place_kernel()(q.data_ptr(), q.stride(0), g.query_rows.data_ptr(), g.requests.data_ptr(),
                      pool.data_ptr(), g.context_slots.data_ptr(), g.context_len,
                      g.context_lens.data_ptr(), n, num_kv_heads, H // num_kv_heads, D, D ** -0.5,
                      int(q.dtype == torch.bfloat16), out.data_ptr(), torch.get_num_threads())
    return out


# --- the model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LlamaShape:
    """What the forward needs from config.json (SmolLM2-135M: hidden 576, 30 layers, 9 heads of
    64, 3 KV heads, MLP 1536, vocab 49152, RMSNorm eps 1e-5, RoPE theta 100,000)."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @classmethod
    def from_config(cls, config: dict) -> "LlamaShape":
        # transformers 5 writes rope_parameters; older configs rope_theta and rope_scaling
        rope = config.get("rope_parameters") or {
            "rope_theta": config.get("rope_theta", 10000.0),
            "rope_type": (config.get("rope_scaling") or {}).get("rope_type", "default")}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"mini_engine runs plain RoPE only, not {rope['rope_type']!r}")
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        return cls(hidden, config["num_hidden_layers"], heads,
                   config.get("num_key_value_heads") or heads,
                   config.get("head_dim") or hidden // heads, config["intermediate_size"],
                   config["vocab_size"], config["rms_norm_eps"], rope["rope_theta"],
                   config["max_position_embeddings"])


@dataclass
class DecoderLayer:
    """One decoder layer: attention then the MLP, each behind an RMSNorm, each added back to x."""
    input_norm: torch.Tensor     # (C,) RMSNorm weight before attention
    qkv: lin.Linear              # C -> (H + 2 KVH) * D: q, k and v
    o: lin.Linear                # H * D -> C
    post_norm: torch.Tensor      # (C,) RMSNorm weight before the MLP
    gate_up: lin.Linear          # C -> 2 * I: gate and up
    down: lin.Linear             # I -> C

    LINEARS = ("qkv", "o", "gate_up", "down")


LAYER_KINDS = (*DecoderLayer.LINEARS, "lm_head")


def apply_linear(layer: lin.Linear, x: torch.Tensor) -> torch.Tensor:
    """x (T, in) -> (T, out) through the layer's kernel."""
    return layer(x)


class Llama:
    def __init__(self, folder: str, dtype: str = "float32", *, linear: str = "F.linear"):
        """dtype: "float32" or "bfloat16"; linear: the kernel every linear layer runs until
        choose_kernels measures (a label of linear.py: "F.linear", "oneDNN packed, unfused"...)."""
        self.config = json.loads((Path(folder) / "config.json").read_text())   # as read
        self.shape = LlamaShape.from_config(self.config)
        self.dtype_name, self.dtype = dtype, DTYPES[dtype]
        self.num_layers, self.num_heads = self.shape.num_layers, self.shape.num_heads
        self.num_kv_heads, self.head_dim = self.shape.num_kv_heads, self.shape.head_dim
        self.eps = self.shape.rms_norm_eps
        w = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            w.update(load_file(path))
        w = {name.removeprefix("model."): t.to(self.dtype) for name, t in w.items()}
        self.embed = w["embed_tokens.weight"]                                  # (V, C)
        self.final_norm = w["norm.weight"]
        self.lm_head = lin.build([w.get("lm_head.weight", self.embed)], linear)   # tied in SmolLM
        self.layers = []
        for i in range(self.num_layers):
            p = f"layers.{i}."
            self.layers.append(DecoderLayer(
                input_norm=w[p + "input_layernorm.weight"],
                qkv=lin.build([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], linear),
                o=lin.build([w[p + "self_attn.o_proj.weight"]], linear),
                post_norm=w[p + "post_attention_layernorm.weight"],
                gate_up=lin.build([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]],
                                  linear),
                down=lin.build([w[p + "mlp.down_proj.weight"]], linear)))
        self.linear_labels = dict.fromkeys(LAYER_KINDS, linear)
        self.linear_choices: dict[str, lin.Choice] = {}   # filled by choose_kernels
        self.linear_batch_sizes: list[int] = []
        self.linear_choice_s = 0.0
        # RoPE tables, as transformers computes them (float32, cat(freqs, freqs))
        d = self.head_dim
        inv_freq = 1.0 / (self.shape.rope_theta
                          ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = (torch.arange(self.shape.max_position_embeddings).float()[:, None]
                 * inv_freq[None, :])
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        half = d // 2
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)

    @property
    def heads_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x KV heads x head_dim x bytes: SmolLM fp32 46,080 B, bf16 23,040."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def choose_kernels(self, batch_sizes) -> dict[str, lin.Choice]:
        """The warm-up: measure every candidate kernel of linear.py on this model's layers at
        these batch sizes (the engine's: 1 and its cap) and rebuild each kind of layer with the
        fastest. About a second on SmolLM-135M; the tokens do not change, only the speed."""
        if self.linear_choices:
            raise RuntimeError(f"kernels already chosen (at batch {self.linear_batch_sizes}); "
                               "load the model again to choose anew")
        start = time.perf_counter()
        layers = {kind: [getattr(layer, kind).parts() for layer in self.layers]
                  for kind in DecoderLayer.LINEARS} | {"lm_head": [self.lm_head.parts()]}
        self.linear_batch_sizes = sorted(set(batch_sizes))
        self.linear_choices, built = lin.choose(layers, self.dtype, self.linear_batch_sizes)
        del layers
        for i, layer in enumerate(self.layers):
            for kind in DecoderLayer.LINEARS:
                setattr(layer, kind, built[kind][i])
        self.lm_head = built["lm_head"][0]
        self.linear_labels = {kind: c.chosen for kind, c in self.linear_choices.items()}
        self.linear_choice_s = time.perf_counter() - start
        return self.linear_choices

    def kv_cache_shape(self, num_pages: int, page_size: int) -> tuple[int, ...]:
        """The shape of one layer's pool, K and V side by side: [num_pages, page_size, 2,
        kv_heads, head_dim] (one gather reads both). Whoever runs the model allocates the pools
        (mini_engine/engine.py) and hands them to forward: the model keeps none, so two engines
        on one model keep their own K/V."""
        return (num_pages, page_size, 2, self.num_kv_heads, self.head_dim)

    # --- the forward ------------------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x / sqrt(mean(x^2) + eps) * weight, in one call (transformers writes it out in five:
        the same in float32; in bfloat16 it rounds once where transformers rounds twice)."""
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        """x (T, heads, D) rotated by its position's angles; cos, sin_signed (T, 1, D).
        transformers: x * cos + cat(-x2, x1) * sin, with sin = cat(s, s). The same products as
        x * cos + cat(x2, x1) * cat(-s, s): the halves swapped in one flip, the sign in the table."""
        swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
        return x * cos + swapped * sin_signed

    def attention(self, q, k, v, batch: Batch, kv_cache: torch.Tensor | QuantizedPool
                  ) -> torch.Tensor:
        """q (T, H, D), k and v (T, KVH, D) -> (T, H*D), each request over its own context;
        kv_cache: this layer's pool (kv_cache_shape), where k and v are written, or its 8-bit
        pool (task 14: mini_engine/kv_quant.py), which writes and reads them itself."""
        T, H, KVH, D = q.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if isinstance(kv_cache, QuantizedPool):
            kv_cache.write(batch.slot_mapping, k, v)
            read = lambda slots: kv_cache.read(slots, q.dtype)   # noqa: E731
        else:
            pool = kv_cache.view(-1, 2, KVH, D)                     # (slots, K/V, KVH, D)
            pool[:, 0].index_copy_(0, batch.slot_mapping, k)    # write through the slot mapping
            pool[:, 1].index_copy_(0, batch.slot_mapping, v)
            read = lambda slots: pool.index_select(0, slots)     # noqa: E731
        outs = []
        for g in batch.groups:
            if g.in_place:                              # pages read in place, in C
                outs.append(attend_in_place(q, g, kv_cache, KVH))
                continue
            B, Q, L, G = g.num_requests, g.num_queries, g.context_len, H // KVH
            kv = read(g.context_slots).view(B, L, 2, KVH, D)           # through page tables
            keys, values = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            # the G query heads sharing a KV head (9 share 3 in SmolLM) become G x Q queries of
            # that head: (B, Q, KVH, G, D) -> (B, KVH, G*Q, D), no K/V copied per query head
            queries = q.index_select(0, g.query_rows).view(B, Q, KVH, G, D)
            queries = queries.permute(0, 2, 3, 1, 4).reshape(B, KVH, G * Q, D)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=g.mask)
            out = out.view(B, KVH, G, Q, D).permute(0, 3, 1, 2, 4).reshape(B * Q, H * D)
            outs.append(out if g.valid is None else out.index_select(0, g.valid))
        if len(outs) == 1 and outs[0].shape[0] == T:     # one group, its rows in order
            return outs[0]
        result = q.new_empty(T, H * D)
        for g, out in zip(batch.groups, outs):
            result.index_copy_(0, g.out_rows, out)
        return result

    def forward(self, batch: Batch, kv_cache: list[torch.Tensor],
                profiler: StepProfiler | None = None) -> torch.Tensor:
        """Logits (S, V) of the rows whose logits are wanted (batch.logit_rows). kv_cache: one
        pool per layer (kv_cache_shape), the caller's, read and written through the batch's
        slots. A profiler, if given, times the matmuls and the attention
        (mini_engine/profiler.py); without one they run as they are."""
        linear, attention = apply_linear, self.attention
        if profiler is not None:
            linear = profiler.timed("matmul", linear)
            attention = profiler.timed("attention", attention)
        T, H, KVH, D = batch.num_rows, self.num_heads, self.num_kv_heads, self.head_dim
        x, cos, sin = self.embed_rows(batch.input_ids, batch.positions)
        for layer, pool in zip(self.layers, kv_cache, strict=True):
            h = self.rms_norm(x, layer.input_norm)
            qkv = linear(layer.qkv, h).view(T, H + 2 * KVH, D)
            qk = self.rope(qkv[:, :H + KVH], cos, sin)            # q and k heads rotated at once
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KVH:]
            x = x + linear(layer.o, attention(q, k, v, batch, pool))
            h = self.rms_norm(x, layer.post_norm)
            gate, up = linear(layer.gate_up, h).chunk(2, dim=-1)
            x = x + linear(layer.down, F.silu(gate) * up)                          # SwiGLU
        return self.logits(x, batch.logit_rows, linear)

    # --- the two ends of a forward, eager or compiled (mini_engine/compiled.py) -------------
    def embed_rows(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """x (T, C), and the RoPE tables of the rows' positions: cos, sin_signed (T, 1, D)."""
        return (self.embed[input_ids], self.cos[positions][:, None],
                self.sin_signed[positions][:, None])

    def logits(self, x: torch.Tensor, logit_rows: torch.Tensor, linear=apply_linear) -> torch.Tensor:
        """(S, V) float logits of the wanted rows of x, the final norm and the LM head through
        linear (apply_linear, or a profiler's timed version of it)."""
        if not len(logit_rows):                    # every row a chunk short of its prompt's end
            return torch.empty(0, self.shape.vocab_size)
        x = self.rms_norm(x[logit_rows], self.final_norm)                             # (S, C)
        return linear(self.lm_head, x).float()                                       # (S, V)
