"""Which way of computing the linear layers should mini_engine keep? Every product of the model in
forward order (q/k/v, o, gate/up, down of every decoder layer, then the LM head), timed as one
pass, each way in turn, at a decode step's rows (1 and the cap) and a prefill's:

    F.linear         torch's public call: the engine's torch way
    oneDNN packed    the weight reordered once for oneDNN, through torch's private mkldnn ops
    inductor frozen  the same products compiled with torch.compile and inductor's freezing,
                     which prepacks the weights itself (public API)
    matmul.c         mini_engine/kernels/matmul.c, where this CPU has AVX512_BF16

The rule of the house: keep the simplest way that comes within 10 % of the fastest on both
machine kinds the lab runs on. Figures: docs/measurements.md.

    python -m benchmarks.linear_ways [--rows 1,16,256] [--rounds 3] [--dtype bfloat16]
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from common import cli, settings
from common import model as lab_model


def weights(folder: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Every linear weight of the model, fused as the engine runs them, in forward order."""
    from pathlib import Path
    w = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        w.update(load_file(path))
    w = {k.removeprefix("model."): t.to(dtype) for k, t in w.items()}
    out, i = [], 0
    while f"layers.{i}.input_layernorm.weight" in w:
        p = f"layers.{i}."
        out += [torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
                w[p + "self_attn.o_proj.weight"],
                torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
                w[p + "mlp.down_proj.weight"]]
        i += 1
    return out + [w.get("lm_head.weight", w["embed_tokens.weight"])]


class Products(torch.nn.Module):
    """Each product on an input of its own shape, so the pass reads every weight once."""

    def __init__(self, ws: list[torch.Tensor]):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(w, requires_grad=False) for w in ws])

    def forward(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [F.linear(x, w) for x, w in zip(xs, self.ws)]


def ways(ws: list[torch.Tensor], dtype: torch.dtype) -> dict:
    """name -> a function of the inputs that runs one pass: F.linear, each packed way of
    mini_engine/kernels/linear.py that works here, and inductor's frozen module."""
    from mini_engine.kernels import linear as lin

    found = {"F.linear": lambda xs: [F.linear(x, w) for x, w in zip(xs, ws)]}
    for way in (w for w in lin.WAYS if lin.works(w, dtype)):
        run = lin.product(way, {w.data_ptr(): way.pack(w) for w in ws})
        found[way.name] = lambda xs, run=run: [run(x, w) for x, w in zip(xs, ws)]
    import torch._inductor.config as inductor_config
    inductor_config.freezing = True
    found["inductor frozen"] = torch.compile(Products(ws).eval(), dynamic=False)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=cli.int_list, default=[1, 16, 256])
    parser.add_argument("--rounds", type=cli.positive_int, default=3)
    parser.add_argument("--passes", type=cli.positive_int, default=7)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args(argv)
    settings.apply_cpu_engine_env()
    dtype = getattr(torch, args.dtype)
    folder = lab_model.resolve_model().path
    ws = weights(folder, dtype)
    found = ways(ws, dtype)
    rows = args.rows
    print(f"{settings.cpu_model_name()}, {torch.get_num_threads()} threads, {args.dtype}, "
          f"{len(ws)} products a pass")
    times = {(name, r): [] for name in found for r in rows}
    with torch.inference_mode():
        for r in rows:
            xs = [torch.randn(r, w.shape[1]).to(dtype) for w in ws]
            ref = found["F.linear"](xs)
            for name, run in found.items():             # warm-up, compile, and a check
                out = run(xs)
                bad = max(float((a.float() - b.float()).abs().max()) for a, b in zip(out, ref))
                if bad > 0.5:
                    raise SystemExit(f"{name} differs from F.linear by {bad} at {r} rows")
            for _ in range(args.rounds):                # the ways take turns
                for name, run in found.items():
                    best = float("inf")
                    for _ in range(args.passes):
                        t = time.perf_counter()
                        run(xs)
                        best = min(best, time.perf_counter() - t)
                    times[name, r].append(best * 1e3)
    print(f"ms a pass (median of {args.rounds} rounds, each the best of {args.passes}; "
          "min-max)")
    print(f"{'way':<16}" + "".join(f"{r:>22} rows" for r in rows))
    for name in found:
        cells = []
        for r in rows:
            t = times[name, r]
            fastest = min(statistics.median(times[n, r]) for n in found)
            cells.append(f"{statistics.median(t):8.2f} ({min(t):.2f}-{max(t):.2f}) "
                         f"{statistics.median(t) / fastest:4.2f}x")
        print(f"{name:<16}" + "".join(f"{c:>27}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
