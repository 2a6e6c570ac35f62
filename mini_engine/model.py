"""The Llama forward of SmolLM in plain torch, with a paged KV cache: PagedAttention on a CPU.

Every token of a step, prefill and decode of different requests alike, is one row of x (T, C):
the linear layers run on all of them at once. Only attention needs to know which request a row
belongs to. Its K and V go into a pool of pages, [num_pages, page_size, kv_heads, head_dim] per
layer, through the slot mapping (vLLM's reshape_and_cache); each request then reads its context
back through its page table (vLLM's block table) and attends to it under a causal mask.

The weights come from the model folder's safetensors files (transformers' names, its formulas
for RMSNorm and RoPE, so the tokens match it exactly). Two fusions, as vLLM's own layers do
(QKVParallelLinear, MergedColumnParallelLinear): q, k, v as one matmul, gate and up as one.
The maths is the same; a CPU runs fewer, fatter products faster than many skinny ones.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class Batch:
    """One step's inputs. T rows in all; B requests, the i-th owning rows [start_i, start_i + n_i)."""
    input_ids: torch.Tensor      # (T,)
    positions: torch.Tensor      # (T,) position of each row in its request
    slot_mapping: torch.Tensor   # (T,) pool slot each row's K/V is written to
    context_slots: torch.Tensor  # (B, L) pool slots of each request's context, L = longest
    query_rows: torch.Tensor     # (B, Q) row of each request's i-th new token, Q = most new tokens
    query_valid: torch.Tensor    # (B, Q) False where a request has fewer than Q new tokens
    mask: torch.Tensor           # (B, 1, Q, L) query at position p sees context positions <= p
    last_rows: torch.Tensor      # (B,) each request's last row: the one whose logits we sample


def make_batch(requests: list[tuple[list[int], int, list[int]]], page_size: int) -> Batch:
    """requests: (new token ids, position of the first, page table) for each request."""
    rows_ids, rows_pos, starts = [], [], []
    for token_ids, start_pos, _ in requests:
        starts.append(len(rows_ids))
        rows_ids += token_ids
        rows_pos += range(start_pos, start_pos + len(token_ids))
    lengths = torch.tensor([len(ids) for ids, _, _ in requests])
    context_lens = torch.tensor([pos + len(ids) for ids, pos, _ in requests])
    num_q, num_ctx = int(lengths.max()), int(context_lens.max())
    # slot of context position p = page_table[p // page_size] * page_size + p % page_size
    num_pages = max(len(table) for _, _, table in requests)
    tables = torch.tensor([table + [0] * (num_pages - len(table)) for _, _, table in requests])
    ctx_pos = torch.arange(num_ctx)
    ctx_pages = torch.clamp(ctx_pos // page_size, max=num_pages - 1)
    context_slots = tables[:, ctx_pages] * page_size + ctx_pos % page_size          # (B, L)
    positions = torch.tensor(rows_pos)
    owner = torch.repeat_interleave(torch.arange(len(requests)), lengths)            # (T,)
    slot_mapping = context_slots[owner, positions]
    q_idx = torch.arange(num_q)
    query_valid = q_idx[None, :] < lengths[:, None]                                  # (B, Q)
    query_rows = torch.tensor(starts)[:, None] + torch.minimum(q_idx[None, :], lengths[:, None] - 1)
    query_pos = torch.where(query_valid, positions[query_rows], 0)   # padding sees position 0
    mask = ctx_pos[None, None, :] <= query_pos[:, :, None]                           # (B, Q, L)
    return Batch(torch.tensor(rows_ids), positions, slot_mapping, context_slots, query_rows,
                 query_valid, mask[:, None], torch.tensor(starts) + lengths - 1)


class Llama:
    def __init__(self, folder: str, dtype: str = "float32"):
        config = json.loads((Path(folder) / "config.json").read_text())
        # transformers 5 writes rope_parameters; older configs rope_theta and rope_scaling
        rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0),
                                                 "rope_type": (config.get("rope_scaling") or
                                                               {}).get("rope_type", "default")}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"mini_engine runs plain RoPE only, not {rope['rope_type']!r}")
        self.config = config
        self.dtype = DTYPES[dtype]
        self.num_layers = config["num_hidden_layers"]
        self.num_heads = config["num_attention_heads"]
        self.num_kv_heads = config.get("num_key_value_heads") or self.num_heads
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.num_heads
        self.eps = config["rms_norm_eps"]
        w = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            w.update(load_file(path))
        w = {name.removeprefix("model."): t.to(self.dtype) for name, t in w.items()}
        self.embed = w["embed_tokens.weight"]                                  # (V, C)
        self.lm_head = w.get("lm_head.weight", self.embed)                     # tied in SmolLM
        self.final_norm = w["norm.weight"]
        self.layers = []
        for i in range(self.num_layers):
            p = f"layers.{i}."
            self.layers.append({
                "input_norm": w[p + "input_layernorm.weight"],
                "qkv": torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
                "o": w[p + "self_attn.o_proj.weight"],
                "post_norm": w[p + "post_attention_layernorm.weight"],
                "gate_up": torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
                "down": w[p + "mlp.down_proj.weight"],
            })
        # RoPE tables, as transformers computes them (float32, cat(freqs, freqs))
        d = self.head_dim
        inv_freq = 1.0 / (rope["rope_theta"]
                          ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.arange(config["max_position_embeddings"]).float()[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        self.kv_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.times = {"matmul": 0.0, "attention": 0.0}   # seconds, summed until read

    @property
    def kv_bytes_per_token(self) -> int:
        # 2 (K,V) x layers x KV heads x head_dim x bytes (SmolLM fp32: 2 x 30 x 3 x 64 x 4 = 46,080)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.embed.element_size()

    def allocate_kv_cache(self, num_pages: int, page_size: int) -> None:
        """One K and one V pool per layer: [num_pages, page_size, kv_heads, head_dim]."""
        shape = (num_pages, page_size, self.num_kv_heads, self.head_dim)
        self.kv_cache = [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                         for _ in range(self.num_layers)]

    # --- the forward ------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x (T, in) @ weight.T -> (T, out), computed as (weight @ x.T).T: the same product,
        but the CPU's matmul library is handed the long side (out) as its M dimension, which it
        runs much faster on skinny batches than F.linear's (T, out) orientation (measured on a
        2-core AVX2 EPYC, fp32, SmolLM's weights at 16 rows: 88 vs 170 ms a step)."""
        start = time.perf_counter()
        y = torch.mm(weight, x.contiguous().t()).t().contiguous()
        self.times["matmul"] += time.perf_counter() - start
        return y

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(x.dtype)

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (T, heads, D) rotated by its position's angles; cos, sin (T, 1, D)."""
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin          # transformers' rotate_half

    def attention(self, layer: int, q, k, v, batch: Batch) -> torch.Tensor:
        """q (T, H, D), k and v (T, KVH, D) -> (T, H*D), each request over its own context."""
        start = time.perf_counter()
        k_pool, v_pool = (c.view(-1, self.num_kv_heads, self.head_dim) for c in self.kv_cache[layer])
        k_pool.index_copy_(0, batch.slot_mapping, k)          # write through the slot mapping
        v_pool.index_copy_(0, batch.slot_mapping, v)
        keys = k_pool[batch.context_slots].transpose(1, 2)     # read through the page tables:
        values = v_pool[batch.context_slots].transpose(1, 2)   # (B, KVH, L, D)
        queries = q[batch.query_rows].transpose(1, 2)          # (B, H, Q, D)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=batch.mask,
                                             enable_gqa=True)  # 9 query heads share 3 KV heads
        out = out.transpose(1, 2)[batch.query_valid]           # back to rows: (T, H, D)
        self.times["attention"] += time.perf_counter() - start
        return out.reshape(out.shape[0], -1)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits (B, V) of each request's last row."""
        T, H, KVH, D = batch.input_ids.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed[batch.input_ids]                                             # (T, C)
        cos, sin = self.cos[batch.positions][:, None], self.sin[batch.positions][:, None]
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
