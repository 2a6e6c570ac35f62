"""The model's shape, read once from its config.json, and the one map of dtype names.

ModelShape serves every place that needs the model's dimensions: the KV bytes per token
(common.kv, tasks 2-4 and 9), the cost of a decode step and the kernel floor's weight shapes
(common.machine). (mini_engine reads its own: it imports nothing of the lab.) DTYPE_BYTES and torch_dtype() are
the one map from the lab's dtype names ("bfloat16", "float32") to sizes and torch dtypes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def torch_dtype(name: str):
    """'bfloat16' -> torch.bfloat16, 'float32' -> torch.float32 (torch imported on first use)."""
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style model's dimensions (SmolLM-135M: hidden 576, 30 layers, 9 heads of 64,
    3 KV heads, MLP 1536, vocab 49152, tied embeddings)."""
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = True

    @classmethod
    def from_config(cls, config) -> "ModelShape":
        """From config.json as a dict, or a transformers config object (same keys)."""
        get = config.get if isinstance(config, dict) else \
            (lambda key, default=None: getattr(config, key, default))
        hidden, heads = get("hidden_size"), get("num_attention_heads")
        return cls(hidden, get("num_hidden_layers"), heads, get("num_key_value_heads") or heads,
                   get("head_dim") or hidden // heads, get("intermediate_size"),
                   get("vocab_size"), bool(get("tie_word_embeddings", True)))

    @classmethod
    def from_folder(cls, model_path: str) -> "ModelShape":
        """From the model folder's config.json (no weights read)."""
        return cls.from_config(read_config(model_path))

    def kv_bytes_per_token(self, dtype: str) -> int:
        """2 (K and V) x layers x KV heads x head_dim x bytes per value.
        SmolLM-135M in bf16: 2 x 30 x 3 x 64 x 2 = 23,040 B (22.5 KiB) per token."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]


def read_config(model_path: str) -> dict:
    """The model folder's config.json as a dict."""
    return json.loads((Path(model_path) / "config.json").read_text())


def max_model_len_for(model_path: str, wanted: int) -> int:
    """wanted, or the model's own limit where that is shorter (the tests' tiny model: vLLM
    refuses a max_model_len over it, and mini_engine's RoPE table ends there)."""
    return min(wanted, read_config(model_path).get("max_position_embeddings", wanted))
