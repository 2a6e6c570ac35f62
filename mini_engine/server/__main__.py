"""python -m mini_engine.server --model PATH [--port 8000] [engine settings]

The engine's settings are vLLM's serve flags where vLLM has one, with vLLM's defaults where
the engine has the same setting (prefix caching and chunked prefill on, 256 sequences); the KV
budget is the lab's 128 MiB. Listens on 127.0.0.1 unless --host says otherwise.
"""
from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
from pathlib import Path

BF16_FLAGS = ("avx512_bf16", "amx_bf16")   # where a CPU computes bfloat16 natively


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from mini_engine.config import KERNELS
    from mini_engine.kv_quant import KV_CACHE_DTYPES

    p = argparse.ArgumentParser(prog="python -m mini_engine.server",
                                description="mini_engine behind an OpenAI-compatible server.")
    p.add_argument("--model", required=True, help="a model folder (config.json, safetensors, "
                                                  "tokenizer)")
    p.add_argument("--served-model-name", default=None,
                   help="the name clients ask for (default: --model as given)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                   help="auto: bfloat16 where the CPU computes it natively, else float32")
    e = p.add_argument_group("engine (mini_engine.EngineConfig)")
    e.add_argument("--max-model-len", type=int, default=128)
    e.add_argument("--max-num-seqs", type=int, default=256, help="requests a step, at most")
    e.add_argument("--max-num-batched-tokens", type=int, default=4096,
                   help="tokens a step, at most")
    e.add_argument("--block-size", type=int, default=16, help="tokens a KV page")
    e.add_argument("--kv-cache-memory-bytes", type=int, default=128 << 20)
    e.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True)
    e.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=True)
    e.add_argument("--num-speculative-tokens", type=int, default=0,
                   help="n-gram guesses a decoding request verifies a step (0: off)")
    e.add_argument("--kernels", default="c", choices=KERNELS,
                   help="c: mini_engine/kernels/ where they build (default); torch: plain torch")
    e.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def resolve_dtype(dtype: str) -> str:
    if dtype != "auto":
        return dtype
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        flags = []
    return "bfloat16" if any(f in flags for f in BF16_FLAGS) else "float32"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        print(f"error: --model {args.model} is not a model folder (no config.json)",
              file=sys.stderr)
        return 2
    if not port_free(args.host, args.port):
        print(f"error: port {args.port} is in use (another server?); choose another --port",
              file=sys.stderr)
        return 2
    import uvicorn
    from transformers import AutoTokenizer

    from mini_engine import EngineConfig, LLMEngine, Llama, eos_token_ids
    from mini_engine.server.api import build_app
    from mini_engine.server.async_engine import AsyncEngine
    from mini_engine.server.metrics import ServerMetrics

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        config = EngineConfig(
            kv_bytes=args.kv_cache_memory_bytes, page_size=args.block_size,
            max_batch=args.max_num_seqs, max_model_len=args.max_model_len, seed=args.seed,
            enable_prefix_caching=args.enable_prefix_caching,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_chunked_prefill=args.enable_chunked_prefill,
            num_speculative_tokens=args.num_speculative_tokens,
            kv_cache_dtype=args.kv_cache_dtype, kernels=args.kernels)
        engine = LLMEngine(Llama(str(folder), resolve_dtype(args.dtype)),
                           eos_token_ids(str(folder)), config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyError as e:        # a config or weights of some other kind of model
        print(f"error: --model {args.model} is not a Llama this engine reads (no {e})",
              file=sys.stderr)
        return 2
    except OSError as e:         # no tokenizer, no safetensors, a file it cannot read
        print(f"error: --model {args.model}: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    engine.warm_up()
    name = args.served_model_name or args.model
    cache = {"block_size": str(config.page_size), "num_gpu_blocks": str(engine.num_pages),
             "cache_dtype": config.kv_cache_dtype,
             "enable_prefix_caching": str(config.enable_prefix_caching),
             "kv_cache_memory_bytes": str(config.kv_bytes),
             "kv_cache_size_tokens": str(engine.num_pages * config.page_size),
             "kv_cache_max_concurrency": f"{engine.num_pages * config.page_size / config.max_model_len:.2f}"}
    metrics = ServerMetrics(name, cache, spec_decode=config.num_speculative_tokens > 0)
    stepper = AsyncEngine(engine, metrics)
    app = build_app(stepper, tokenizer, name, config.max_model_len)
    used = ", ".join(f"{k} {v}" for k, v in engine.kernels_used().items())
    print(f"mini_engine serving {name} on http://{args.host}:{args.port} "
          f"({engine.model.dtype_name}, {engine.num_pages} KV pages of {config.page_size} "
          f"tokens; {used})", flush=True)
    return serve(stepper, uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level="warning",
        timeout_graceful_shutdown=3)))   # a stream still open at Ctrl-C ends after 3 s


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1" if host == "0.0.0.0" else host, port)) != 0


def serve(stepper, http) -> int:
    """uvicorn in a thread of its own, the step loop in this one (the main thread: async_engine.py
    says why), until Ctrl-C or SIGTERM, or until uvicorn ends on its own (it could not listen:
    it says why, and the exit code is 1); then both stop."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)   # SIGTERM as Ctrl-C
    thread = threading.Thread(target=http.run, name="http", daemon=True)
    thread.start()
    threading.Thread(target=lambda: (thread.join(), stepper.stop()), daemon=True).start()
    try:
        stepper.run()
    except KeyboardInterrupt:
        pass
    finally:
        stepper.close()          # the requests still open end now, with an error event
        http.should_exit = True
        thread.join(timeout=10)
    if stepper.failed:
        print(f"error: {stepper.failed} (the traceback above); the server stopped",
              file=sys.stderr)
    return 0 if http.started and not stepper.failed else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:     # Ctrl-C while the model loads: nothing to stop yet
        print("interrupted", file=sys.stderr)
        sys.exit(130)
