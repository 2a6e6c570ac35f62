"""The Llama forward of SmolLM in plain torch, with a paged KV cache: PagedAttention on a CPU.

Every token of a step, prefill and decode of different requests alike, is one row of x (T, C):
the linear layers run on all of them at once. Only attention needs to know which request a row
belongs to. Its K and V go into a pool of pages, [num_pages, page_size, 2 (K, V), kv_heads,
head_dim] per layer, through the slot mapping (vLLM's reshape_and_cache); each request then reads
its context back through its page table (vLLM's block table) and attends to it under a causal
mask. Requests decoding one token and requests prefilling several attend in two groups, as
vLLM's attention backends split decode from prefill: a decode step pads no query.

The weights come from the model folder's safetensors files (transformers' names, its formulas
for RMSNorm and RoPE, so the tokens match it exactly). How the linear layers are handed to the
matmul library (which kernel, q/k/v and gate/up fused or not) is measured on this CPU when the
model loads (mini_engine/linear.py): the maths is the same, the speed is the machine's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from common.shape import ModelShape, read_config, torch_dtype
from mini_engine import linear as lin



@dataclass
class Group:
    """Requests that attend together: B requests of at most Q new tokens each, over contexts of at
    most L tokens. Decoding requests (Q = 1) form one group, prefilling ones another."""
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


@dataclass
class Batch:
    """One step's inputs. T rows in all; B requests, the i-th owning rows [start_i, start_i + n_i)."""
    input_ids: torch.Tensor      # (T,)
    positions: torch.Tensor      # (T,) position of each row in its request
    slot_mapping: torch.Tensor   # (T,) pool slot each row's K/V is written to
    groups: list[Group]          # decode and prefill, each attended in one call
    last_rows: torch.Tensor      # (B,) each request's last row: the one whose logits we sample
    num_rows: int


def make_group(requests: list[tuple[int, int, int, list[int]]], page_size: int,
               heads_per_kv: int, dtype: torch.dtype) -> Group:
    """requests: (first row, new tokens, position of the first, page table) of each request."""
    starts = torch.tensor([r[0] for r in requests])
    lengths = torch.tensor([r[1] for r in requests])
    first_pos = torch.tensor([r[2] for r in requests])
    num_q, num_ctx = int(lengths.max()), int((first_pos + lengths).max())
    # slot of context position p = page_table[p // page_size] * page_size + p % page_size
    num_pages = max(len(r[3]) for r in requests)
    tables = torch.tensor([r[3] + [0] * (num_pages - len(r[3])) for r in requests])
    ctx_pos = torch.arange(num_ctx)
    ctx_pages = torch.clamp(ctx_pos // page_size, max=num_pages - 1)
    context_slots = tables[:, ctx_pages] * page_size + ctx_pos % page_size           # (B, L)
    q_idx = torch.arange(num_q)
    valid = q_idx[None, :] < lengths[:, None]                                        # (B, Q)
    q_off = torch.minimum(q_idx[None, :], lengths[:, None] - 1)
    query_pos = first_pos[:, None] + q_off                                           # (B, Q)
    sees = ctx_pos[None, None, :] <= query_pos[:, :, None]                            # (B, Q, L)
    mask = torch.zeros(sees.shape, dtype=dtype).masked_fill_(~sees, float("-inf"))
    mask = mask.repeat(1, heads_per_kv, 1)[:, None]                        # (B, 1, G*Q, L)
    rows = starts[:, None] + q_off
    all_valid = bool(valid.all())
    return Group(rows.flatten(), context_slots.flatten(), mask,
                 None if all_valid else valid.flatten().nonzero().squeeze(1),
                 rows[valid], len(requests), num_q, num_ctx)


def make_batch(requests: list[tuple[list[int], int, list[int], int | None]], page_size: int,
               heads_per_kv: int = 1, dtype: torch.dtype = torch.float32) -> Batch:
    """requests: (new token ids, position of the first, page table, write slot) for each
    request; write slot None: its K/V goes into its pages, else into that one slot."""
    rows_ids, rows_pos, rows_slot, decode, prefill = [], [], [], [], []
    for token_ids, start_pos, table, write_slot in requests:
        (decode if len(token_ids) == 1 else prefill).append(
            (len(rows_ids), len(token_ids), start_pos, table))
        rows_ids += token_ids
        for pos in range(start_pos, start_pos + len(token_ids)):
            rows_pos.append(pos)
            rows_slot.append(table[pos // page_size] * page_size + pos % page_size
                             if write_slot is None else write_slot)
    groups = [make_group(g, page_size, heads_per_kv, dtype) for g in (decode, prefill) if g]
    last_rows = torch.tensor([len(r[0]) for r in requests]).cumsum(0) - 1
    return Batch(torch.tensor(rows_ids), torch.tensor(rows_pos), torch.tensor(rows_slot),
                 groups, last_rows, len(rows_ids))


LAYER_KINDS = ("qkv", "o", "gate_up", "down", "lm_head")


class Llama:
    def __init__(self, folder: str, dtype: str = "float32", batch_sizes: tuple = (1, 16),
                 linear: str = "auto"):
        """batch_sizes: the rows a step will have (1 and the engine's cap), at which the linear
        layers' kernels are measured; linear: "auto" (measure) or one kernel label for all."""
        config = read_config(folder)
        # transformers 5 writes rope_parameters; older configs rope_theta and rope_scaling
        rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0),
                                                 "rope_type": (config.get("rope_scaling") or
                                                               {}).get("rope_type", "default")}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"mini_engine runs plain RoPE only, not {rope['rope_type']!r}")
        self.config, self.shape, self.dtype_name = config, ModelShape.from_config(config), dtype
        self.dtype = torch_dtype(dtype)
        self.num_layers, self.num_heads = self.shape.num_layers, self.shape.num_heads
        self.num_kv_heads, self.head_dim = self.shape.num_kv_heads, self.shape.head_dim
        self.eps = config["rms_norm_eps"]
        w = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            w.update(load_file(path))
        w = {name.removeprefix("model."): t.to(self.dtype) for name, t in w.items()}
        self.embed = w["embed_tokens.weight"]                                  # (V, C)
        self.final_norm = w["norm.weight"]

        def parts(i: int) -> dict[str, list[torch.Tensor]]:   # each layer kind's weight, in parts
            p = f"layers.{i}."
            return {"qkv": [w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"],
                    "o": [w[p + "self_attn.o_proj.weight"]],
                    "gate_up": [w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]],
                    "down": [w[p + "mlp.down_proj.weight"]]}

        lm_head = [w.get("lm_head.weight", self.embed)]                       # tied in SmolLM
        layers = {kind: [parts(i)[kind] for i in range(self.num_layers)]
                  for kind in LAYER_KINDS[:-1]} | {"lm_head": [lm_head]}
        self.linear_batch_sizes = sorted(set(batch_sizes))
        start = time.perf_counter()
        if linear == "auto":
            self.linear_choices, built = lin.choose(layers, self.dtype, self.linear_batch_sizes)
            labels = {kind: c.chosen for kind, c in self.linear_choices.items()}
        else:
            self.linear_choices, labels = {}, dict.fromkeys(LAYER_KINDS, linear)
            built = {kind: [lin.build(p, linear) for p in per_layer]
                     for kind, per_layer in layers.items()}
        self.linear_choice_s = time.perf_counter() - start
        self.lm_head = built["lm_head"][0]
        self.layers = []
        for i in range(self.num_layers):
            p = f"layers.{i}."
            self.layers.append({
                "input_norm": w[p + "input_layernorm.weight"],
                "post_norm": w[p + "post_attention_layernorm.weight"],
                **{kind: built[kind][i] for kind in LAYER_KINDS[:-1]}})
        self.linear_labels = labels
        # RoPE tables, as transformers computes them (float32, cat(freqs, freqs))
        d = self.head_dim
        inv_freq = 1.0 / (rope["rope_theta"]
                          ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.arange(config["max_position_embeddings"]).float()[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        half = d // 2
        self.sin_signed = torch.cat([-self.sin[:, :half], self.sin[:, half:]], dim=-1)
        self.kv_cache: list[torch.Tensor] = []
        self.times = {"matmul": 0.0, "attention": 0.0}   # seconds, summed until read

    @property
    def heads_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def kv_bytes_per_token(self) -> int:
        return self.shape.kv_bytes_per_token(self.dtype_name)   # SmolLM fp32: 46,080 B

    def allocate_kv_cache(self, num_pages: int, page_size: int) -> None:
        """One pool per layer, K and V side by side: [num_pages, page_size, 2, kv_heads, head_dim]
        (one gather reads both)."""
        shape = (num_pages, page_size, 2, self.num_kv_heads, self.head_dim)
        self.kv_cache = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.num_layers)]

    # --- the forward ------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, layer: lin.Linear) -> torch.Tensor:
        """x (T, in) -> (T, out) through the kernel chosen for this layer kind at load."""
        start = time.perf_counter()
        y = layer(x)
        self.times["matmul"] += time.perf_counter() - start
        return y

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

    def attention(self, layer: int, q, k, v, batch: Batch) -> torch.Tensor:
        """q (T, H, D), k and v (T, KVH, D) -> (T, H*D), each request over its own context."""
        start = time.perf_counter()
        T, H, KVH, D = q.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        pool = self.kv_cache[layer].view(-1, 2, KVH, D)         # (slots, K/V, KVH, D)
        pool[:, 0].index_copy_(0, batch.slot_mapping, k)        # write through the slot mapping
        pool[:, 1].index_copy_(0, batch.slot_mapping, v)
        outs = []
        for g in batch.groups:
            B, Q, L, G = g.num_requests, g.num_queries, g.context_len, H // KVH
            kv = pool.index_select(0, g.context_slots).view(B, L, 2, KVH, D)   # page tables
            keys, values = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            # the G query heads sharing a KV head (9 share 3 in SmolLM) become G x Q queries of
            # that head: (B, Q, KVH, G, D) -> (B, KVH, G*Q, D), no K/V copied per query head
            queries = q.index_select(0, g.query_rows).view(B, Q, KVH, G, D)
            queries = queries.permute(0, 2, 3, 1, 4).reshape(B, KVH, G * Q, D)
            out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=g.mask)
            out = out.view(B, KVH, G, Q, D).permute(0, 3, 1, 2, 4).reshape(B * Q, H * D)
            outs.append(out if g.valid is None else out.index_select(0, g.valid))
        if len(outs) == 1 and outs[0].shape[0] == T:     # one group, its rows in order
            result = outs[0]
        else:
            result = q.new_empty(T, H * D)
            for g, out in zip(batch.groups, outs):
                result.index_copy_(0, g.out_rows, out)
        self.times["attention"] += time.perf_counter() - start
        return result

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits (B, V) of each request's last row."""
        T, H, KVH, D = batch.num_rows, self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed[batch.input_ids]                                             # (T, C)
        cos = self.cos[batch.positions][:, None]
        sin = self.sin_signed[batch.positions][:, None]
        for i, layer in enumerate(self.layers):
            h = self.rms_norm(x, layer["input_norm"])
            qkv = self.linear(h, layer["qkv"]).view(T, H + 2 * KVH, D)
            qk = self.rope(qkv[:, :H + KVH], cos, sin)            # q and k heads rotated at once
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, H + KVH:]
            x = x + self.linear(self.attention(i, q, k, v, batch), layer["o"])
            h = self.rms_norm(x, layer["post_norm"])
            gate, up = self.linear(h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + self.linear(F.silu(gate) * up, layer["down"])                 # SwiGLU
        x = self.rms_norm(x[batch.last_rows], self.final_norm)                       # (B, C)
        return self.linear(x, self.lm_head).float()                                  # (B, V)
