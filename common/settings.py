"""The source's settings, the CPU environment for vLLM, and the dtype policy."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent

# --- Settings from the source article (section 1) -------------------------------------------
HUB_MODEL_ID = "HuggingFaceTB/SmolLM-135M"
MAX_MODEL_LEN = 128                  # max_model_len: prompt + generated tokens per request
KV_CACHE_BYTES = 128 * 1024 * 1024   # kv_cache_memory_bytes=134217728: 128 MiB for the KV cache
MAX_NEW_TOKENS = 50                  # every generation in the lab asks for 50 new tokens
TEMPERATURE = 0.7
SEED = 0                             # sampling seed, so a rerun generates the same text
PROMPT = "Explain what a large language model is in simple terms."
SERVER_PORT = 8000
DASHBOARD_PORT = 7860

# KV block (page) size in tokens of task 2's engine and of the lab's server (--block-size), read
# back from the engine wherever the lab reports KV capacity. 128 is vLLM's CPU default; task 4
# teaches 16-token pages, which vLLM's CPU backend also accepts. `make bench-server`
# (benchmarks/server_configs.py) measures 16, 32 and 128 side by side on your machine: their
# throughputs came out within the run-to-run noise (figures: docs/server.md). So the lab's engine
# runs task 4's page size: the page of the lesson is the page vLLM allocates, and task 7's
# config B (max_model_len 64) holds twice A's requests.
BLOCK_SIZE = 16

# The environment vLLM reads when its engine starts, for task 2's in-process LLM and for the lab's
# API server alike (decided here, once):
# - VLLM_ENABLE_V1_MULTIPROCESSING=0 runs the model's worker inside the engine process, as the
#   source does to fit a 4 GB VM. Offline (task 2) the whole engine then runs in the script. The
#   API server still runs its engine core in a second process, but the worker lives in it instead
#   of a third: one process fewer, less memory, a sooner start and more tokens/s at 20 users
#   (`make bench-server`; figures: docs/server.md).
# - TORCHDYNAMO_DISABLE=1 with enforce_eager=True: no torch.compile, less memory and start-up.
ENGINE_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
              "TORCHDYNAMO_DISABLE": "1"}

# Where the lab keeps what it derives once (the converted offline model, the remembered model
# choice) and what the scripts measure. Both can be moved, e.g. by the tests.
def cache_dir() -> Path:
    return Path(os.environ.get("LAB_CACHE_DIR", REPO_DIR / ".cache"))


def results_dir() -> Path:
    return Path(os.environ.get("LAB_RESULTS_DIR", REPO_DIR / "results"))


def server_state_dir() -> Path:
    """Where the lab's server keeps its state and log (server-<port>.json/.log): the cache, or
    LAB_SERVER_DIR, so the tests never share a state file with a learner's running lab."""
    return Path(os.environ.get("LAB_SERVER_DIR", cache_dir()))


def apply_cpu_engine_env() -> None:
    """Set the source's CPU environment before vLLM is imported.

    - ENGINE_ENV (above): the in-process engine (the default mode starts two more Python
      processes, each a large one: docs/measurements.md; the source ran in a 4 GB VM), no
      torch.compile.
    - VLLM_CPU_KVCACHE_SPACE must be unset: it overrides kv_cache_memory_bytes and takes whole GiB.
    - VLLM_LOGGING_LEVEL=ERROR keeps the engine's INFO and WARNING lines out of the reports (the figures
      they show are read from the engine and printed in the report instead); set it to INFO to
      see them.
    """
    os.environ.update(ENGINE_ENV)
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # The hub is never needed once the model is resolved to a local folder.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- Machine and dtype policy ----------------------------------------------------------------
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")   # native bf16 on x86: AVX512-BF16 or AMX
DTYPE_CHOICES = ("auto", "bfloat16", "float32")


def cpu_flags() -> set[str]:
    """The CPU feature flags of this machine (Linux /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def cpu_vector_units(flags: set[str] | None = None) -> str:
    """The widest vector and matrix units the CPU has, as the lab's figures depend on them:
    'AMX, AVX-512, avx512_bf16', 'AVX-512, avx512_bf16', 'AVX2' ..."""
    flags = cpu_flags() if flags is None else flags
    units = [name for flag, name in (("amx_bf16", "AMX"), ("avx512f", "AVX-512"),
                                     ("avx512_bf16", "avx512_bf16")) if flag in flags]
    if "avx512f" not in flags:
        units.insert(len(units) - ("avx512_bf16" in units), "AVX2" if "avx2" in flags
                     else "no AVX2")
    return ", ".join(units)


def memory_total_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def num_cores() -> int:
    """Cores this process may run on (what the engine and torch will use)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class DtypeChoice:
    dtype: str      # "bfloat16" or "float32"
    reason: str     # one line for the report: why this dtype ran


def resolve_dtype(requested: str = "auto", flags: set[str] | None = None) -> DtypeChoice:
    """--dtype auto|bfloat16|float32 -> the dtype that runs, and why.

    auto picks bfloat16 only where the CPU computes it natively. Without avx512_bf16/amx_bf16,
    torch's bf16 matmul falls back to a slow path, far slower than fp32 (docs/measurements.md),
    so fp32 gives more throughput there, at twice the KV bytes per token.
    """
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"unknown dtype {requested!r} (choose from {', '.join(DTYPE_CHOICES)})")
    if requested != "auto":
        return DtypeChoice(requested, "asked for with --dtype")
    flags = cpu_flags() if flags is None else flags
    native = sorted(f for f in BF16_CPU_FLAGS if f in flags)
    if native:
        return DtypeChoice("bfloat16", f"auto: CPU has native bf16 ({', '.join(native)})")
    return DtypeChoice("float32", "auto: CPU has no native bf16 (no avx512_bf16/amx_bf16), "
                                  "fp32 is faster here")
