"""Builds the kernels' C for this machine the first time one is needed, and loads it.

A source is built once per CPU and compiler with -O3 -march=native into
~/.cache/mini_engine/<name>-<hash>.so; the hash covers the source, the flags, the compiler and
the CPU's feature flags, so a library built for another CPU or an older source is never loaded.
-fopenmp: loaded after torch, the library binds to the libgomp torch already loaded, so both
share one pool of threads. No -ffast-math: the 8-bit conversions must round as torch does, and
gcc links a library built with it to code that turns off subnormals for the whole process.
Where no compiler works, library() returns None and the engine runs its torch way.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


@functools.cache
def library(source_name: str) -> ctypes.CDLL | None:
    """The library built from kernels/<source_name>, or None where it cannot be had: no C
    compiler, a compiler that fails (e.g. one without OpenMP), a cache folder it cannot write,
    a library it cannot load."""
    # CC, where set, is the only compiler tried: CC=/nonexistent is how a test refuses the build
    cc = (shutil.which(os.environ["CC"]) if os.environ.get("CC")
          else shutil.which("gcc") or shutil.which("cc"))
    if cc is None:
        return None
    source = Path(__file__).with_name(source_name)
    cpuinfo = Path("/proc/cpuinfo")
    cpu = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")),
               "") if cpuinfo.exists() else ""
    key = hashlib.sha256(b"\0".join([source.read_bytes(), " ".join(FLAGS).encode(),
                                      cc.encode(), cpu.encode()])).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mini_engine"
    built = cache / f"{source.stem}-{key}.so"
    try:
        if not built.exists():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = built.with_suffix(f".{os.getpid()}.tmp")
            if subprocess.run([cc, *FLAGS, "-o", str(tmp), str(source)],
                              capture_output=True, text=True).returncode != 0:
                return None
            tmp.rename(built)               # whole, or not there: two processes may build it
        return ctypes.CDLL(str(built))
    except OSError:
        return None
