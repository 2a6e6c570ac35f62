"""verify_environment.py fails with a hint when the model is missing. (Its passing run, on the
real model, is the first step of tests/test_lab.py; its other FAIL paths are in
tests/test_faults.py.)"""
from __future__ import annotations

from tests.conftest import run_script


def test_verify_environment_fails_with_a_hint_for_a_missing_model():
    proc = run_script("verify_environment.py", "--model", "/no/such/model",
                      env={"HF_HUB_OFFLINE": "1"}, timeout=300)
    assert proc.returncode == 1
    assert "ENVIRONMENT CHECK: 4/5 passed" in proc.stdout
    assert "FAIL - model '/no/such/model' (--model) not found" in proc.stdout
    assert "---> HINT:" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
