"""The Llama forward of SmolLM in plain torch, with a paged KV cache: PagedAttention on a CPU.

Every token of a step, prefill and decode of different requests alike, is one row of x (T, C):
the linear layers run on all of them at once. Only attention needs to know which request a row
belongs to. Its K and V go into a pool of pages, [num_pages, page_size, 2 (K, V), kv_heads,
head_dim] per layer, through the slot mapping (vLLM's reshape_and_cache); each request then reads
its context back through its page table (vLLM's block table) and attends to it. Requests decoding
one token and requests prefilling several attend apart, as vLLM's attention backends split decode
from prefill (a decode pads no query): each group's contexts are gathered from their pages and
attended with torch's SDPA under a mask. mini_engine/kernels/ has the C that reads the pages in
place instead; make_batch takes it where the engine asks.

The pools are not the model's: whoever runs it allocates them and hands them to forward, as
vLLM's model runner keeps the KV cache beside the model. A model that held them would be one pool
shared by every engine built on it.

The weights come from the model folder's safetensors files (transformers' names, its formulas
for RMSNorm and RoPE, so the tokens match it exactly).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, NamedTuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mini_engine.kv_quant import QuantizedPool

if TYPE_CHECKING:
    from mini_engine.profiler import StepProfiler

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
Linear = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]   # (x, weight) -> x @ weight.T
# A gathered SDPA call reads at most CALL_SLOTS padded context slots, and a prefill's queries
# go in pieces of QUERY_CHUNK: SDPA computes the whole rectangle of queries x context and masks
# half away. Both bound the copy and the waste at long contexts (docs/measurements.md).
CALL_SLOTS = 2048
QUERY_CHUNK = 64


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
    """Requests that attend in one SDPA call: B requests of at most Q new tokens each, over
    contexts of at most L tokens, gathered from their pages and padded to the longest."""
    query_rows: torch.Tensor     # (B*Q,) row of each request's q-th new token (a shorter request
                                 # repeats its last row; those queries are computed, then dropped)
    context_slots: torch.Tensor  # (B*L,) pool slot of each request's context position
    mask: torch.Tensor           # (B, 1, G*Q, L) additive, one copy per query head of a KV head:
                                 # 0 where the query at position p sees context position <= p
    valid: torch.Tensor | None   # (n,) which of the B*Q queries are real (None: all of them)
    out_rows: torch.Tensor       # (n,) the row each real query's output goes to
    num_requests: int
    num_queries: int
    context_len: int
    context_lens: torch.Tensor   # (B,) each request's own context length (L is the longest)
    in_place = False             # kernels/attention.py's InPlaceGroup reads the pages itself


@dataclass
class Batch:
    """One step's inputs. T rows in all; B requests, the i-th owning rows [start_i, start_i + n_i)."""
    input_ids: torch.Tensor      # (T,)
    positions: torch.Tensor      # (T,) position of each row in its request
    slot_mapping: torch.Tensor   # (T,) pool slot each row's K/V is written to
    groups: list                 # Groups, decode and prefill apart, in calls of a bounded
                                 # size; or kernels/attention.py's one InPlaceGroup
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


def split_by_context(members: list[GroupMember], call_slots: int) -> list[list[GroupMember]]:
    """Members in calls of at most call_slots padded context slots (a call's requests x its
    longest context; one request alone may have more), neighbours by context length so that
    little is padded. One call keeps the rows' own order. Why calls are bounded: CALL_SLOTS."""
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
               dtype: torch.dtype = torch.float32, call_slots: int = CALL_SLOTS,
               query_chunk: int = QUERY_CHUNK,
               in_place: Callable[[list[GroupMember], int], list] | None = None) -> Batch:
    """Every request's chunk as rows of one batch, its K/V slots, and its attention groups:
    decode requests apart from prefill ones, a prefill's queries in pieces of at most
    query_chunk, each kind in calls of at most call_slots. in_place: a function of the members
    and the page size that makes the groups instead (kernels/attention.py's in_place_groups)."""
    rows_ids, rows_pos, rows_slot, members = [], [], [], []
    for chunk in chunks:
        members.append(GroupMember(len(rows_ids), len(chunk.token_ids), chunk.start_pos,
                                   chunk.page_table))
        rows_ids += chunk.token_ids
        for pos in range(chunk.start_pos, chunk.start_pos + len(chunk.token_ids)):
            rows_pos.append(pos)
            rows_slot.append(chunk.page_table[pos // page_size] * page_size + pos % page_size
                             if chunk.write_slot is None else chunk.write_slot)
    if in_place is not None:
        groups = in_place(members, page_size)
    else:
        decode = [m for m in members if m.num_queries == 1]
        prefill = [GroupMember(m.first_row + q, min(query_chunk, m.num_queries - q),
                               m.start_pos + q, m.page_table)    # a prefill's queries in pieces
                   for m in members if m.num_queries > 1
                   for q in range(0, m.num_queries, query_chunk)]
        groups = [make_group(part, page_size, heads_per_kv, dtype)
                  for kind in (decode, prefill) for part in split_by_context(kind, call_slots)]
    ends = torch.tensor([len(c.token_ids) for c in chunks]).cumsum(0).tolist()
    logit_rows = torch.tensor([row for c, end in zip(chunks, ends)
                               for row in range(end - c.num_logits, end)], dtype=torch.long)
    return Batch(torch.tensor(rows_ids), torch.tensor(rows_pos), torch.tensor(rows_slot),
                 groups, logit_rows, len(rows_ids))


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
    qkv: torch.Tensor            # (H + 2 KVH) * D x C: q, k and v as one weight, as vLLM fuses
    o: torch.Tensor              # C x H * D
    post_norm: torch.Tensor      # (C,) RMSNorm weight before the MLP
    gate_up: torch.Tensor        # 2 * I x C: gate and up as one weight
    down: torch.Tensor           # C x I

    LINEARS = ("qkv", "o", "gate_up", "down")


class Llama:
    def __init__(self, folder: str, dtype: str = "float32"):
        """dtype: "float32" or "bfloat16"."""
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
        self.lm_head = w.get("lm_head.weight", self.embed)                     # tied in SmolLM
        self.layers = []
        for i in range(self.num_layers):
            p = f"layers.{i}."
            self.layers.append(DecoderLayer(
                input_norm=w[p + "input_layernorm.weight"],
                qkv=torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
                o=w[p + "self_attn.o_proj.weight"],
                post_norm=w[p + "post_attention_layernorm.weight"],
                gate_up=torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
                down=w[p + "mlp.down_proj.weight"]))
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

    def linear_weights(self) -> list[torch.Tensor]:
        """Every weight a linear layer multiplies by, the LM head's last."""
        return [getattr(layer, kind) for layer in self.layers
                for kind in DecoderLayer.LINEARS] + [self.lm_head]

    def kv_cache_shape(self, num_pages: int, page_size: int) -> tuple[int, ...]:
        """One layer's pool, K and V side by side (one gather reads both): [num_pages,
        page_size, 2, kv_heads, head_dim]. The engine allocates it; the model keeps none."""
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
        pool (mini_engine/kv_quant.py), which writes and reads them itself."""
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
            if g.in_place:                     # kernels/attention.py: the pages read where they are
                outs.append(g.attend(q, kv_cache, KVH))
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
                profiler: StepProfiler | None = None, linear: Linear = F.linear) -> torch.Tensor:
        """Logits (S, V) of the rows whose logits are wanted (batch.logit_rows). kv_cache: one
        pool per layer (kv_cache_shape), the caller's, read and written through the batch's
        slots. A profiler, if given, times the matmuls and the attention
        (mini_engine/profiler.py). linear(x, weight): the products, F.linear or a kernel's."""
        attention = self.attention
        if profiler is not None:
            linear = profiler.timed("matmul", linear)
            attention = profiler.timed("attention", attention)
        T, H, KVH, D = batch.num_rows, self.num_heads, self.num_kv_heads, self.head_dim
        x, cos, sin = self.embed_rows(batch.input_ids, batch.positions)
        for layer, pool in zip(self.layers, kv_cache, strict=True):
            h = self.rms_norm(x, layer.input_norm)
            qkv = linear(h, layer.qkv).view(T, H + 2 * KVH, D)
            qk = self.rope(qkv[:, :H + KVH], cos, sin)            # q and k heads rotated at once
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KVH:]
            x = x + linear(attention(q, k, v, batch, pool), layer.o)
            h = self.rms_norm(x, layer.post_norm)
            gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, layer.down)                          # SwiGLU
        return self.logits(x, batch.logit_rows, linear)

    # --- the two ends of a forward, eager or compiled (kernels/compiled.py) -----------------
    def embed_rows(self, input_ids: torch.Tensor, positions: torch.Tensor):
        """x (T, C), and the RoPE tables of the rows' positions: cos, sin_signed (T, 1, D)."""
        return (self.embed[input_ids], self.cos[positions][:, None],
                self.sin_signed[positions][:, None])

    def logits(self, x: torch.Tensor, logit_rows: torch.Tensor, linear: Linear = F.linear
               ) -> torch.Tensor:
        """(S, V) float logits of the wanted rows of x: the final norm, then the LM head."""
        if not len(logit_rows):                    # every row a chunk short of its prompt's end
            return torch.empty(0, self.shape.vocab_size)
        x = self.rms_norm(x[logit_rows], self.final_norm)                             # (S, C)
        return linear(x, self.lm_head).float()                                       # (S, V)
