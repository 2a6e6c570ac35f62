"""Tasks 1-2 end to end: real transformers, a real in-process vLLM engine. Fast on the tiny
model the tests build (tests/test_lab.py runs them on the real packaged model, task 2 taking
task 1's saved baseline). Timings are reported by the scripts, never asserted here: only that
they were measured."""
from __future__ import annotations

import pytest

from common import settings, steps
from tests.conftest import assert_fits, run_script, saved_result


def check_generation(r: dict, tokens: int = 50) -> None:
    assert r["generated_tokens"] == tokens
    assert r["total_time_s"] > 0 and r["tokens_per_s"] > 0   # the formula: test_reports, by hand
    assert r["warmup_excluded"] is True
    assert r["threads"] >= 1


def test_task_1_on_the_tiny_model(tiny_model):
    proc = run_script("task_1_hf_baseline.py", "--model", tiny_model, "--dtype", "float32",
                      "--max-tokens", "20")
    assert proc.returncode == 0, proc.stderr[-2000:]
    t1 = saved_result("task_1_hf_baseline")
    check_generation(t1, 20)
    assert (t1["model_path"], t1["dtype"], t1["model_source"]) == (tiny_model, "float32",
                                                                  "--model, local folder")
    assert "Tokens per second (tok/s):" in proc.stdout
    assert "dtype: float32 (asked for with --dtype)" in " ".join(proc.stdout.split())
    assert_fits(proc.stdout)
    assert proc.stdout.count("\nModel:") == 1                # the model row once per report
    step = steps.by_name()["task_1_hf_baseline"]             # read back typed, as the summary
    typed = step.load()
    assert isinstance(typed, step.record) and typed.settings.max_new_tokens == 20
    assert step.row(typed) == f"{t1['tokens_per_s']:.1f} tok/s"


@pytest.mark.engine
def test_task_2_on_the_tiny_model_measures_its_own_baseline(tiny_model):
    """No task 1 result for this model: task 2 measures the baseline itself. (Task 2 taking task
    1's saved result is checked in tests/test_lab.py, on the real model.)"""
    proc = run_script("task_2_vllm_inference.py", "--model", tiny_model, "--dtype", "float32",
                      "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    t2 = saved_result("task_2_vllm_inference")
    check_generation(t2, 8)
    assert t2["baseline"]["source"] == "measured now" and t2["baseline"]["tokens_per_s"] > 0
    assert "No matching task 1 result saved" in proc.stdout
    assert t2["speedup"] > 0 and f"vLLM is {t2['speedup']:.1f}x" in proc.stdout   # by hand:
    # tests/test_reports.py::test_task2_speedup_by_hand
    # 2 (K,V) x 2 layers x 1 KV head x 64 dims x 4 B = 1,024 B/token
    assert t2["kv_capacity_derived"]["kv_bytes_per_token"] == 1_024
    # 128 MiB / (1,024 B x 16 tokens) = 8,192 blocks of settings.BLOCK_SIZE = 16 (task 4's page);
    # a request of 128 tokens holds 8 of them: 1,024 at once
    assert settings.BLOCK_SIZE == 16
    assert t2["kv_capacity_engine"] == {"num_blocks": 8_192, "block_size": 16,
                                        "num_tokens": 131_072, "max_concurrency": 1_024.0}
    assert t2["kv_capacity_agree"] is True
    assert "Engine and config agree to the block." in proc.stdout
    assert_fits(proc.stdout)
    assert proc.stdout.count("\nModel:") == 1
    step = steps.by_name()["task_2_vllm_inference"]          # read back typed, as the summary
    typed = step.load()
    assert typed.settings.block_size == 16 and typed.kv_capacity_derived.num_blocks == 8_192
    assert step.row(typed) == f"{t2['tokens_per_s']:.1f} tok/s ({t2['speedup']:.1f}x)"
