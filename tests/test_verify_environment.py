"""verify_environment.py passes on a set-up machine, with no hub, and says what it checked."""
from __future__ import annotations

from tests.conftest import run_script, saved_result


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


def test_verify_environment_fails_with_a_hint_for_a_missing_model():
    proc = run_script("verify_environment.py", "--model", "/no/such/model",
                      env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 1
    assert "ENVIRONMENT CHECK: 4/5 passed" in proc.stdout
    assert "FAIL - model '/no/such/model' (--model) not found" in proc.stdout
    assert "---> HINT:" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
