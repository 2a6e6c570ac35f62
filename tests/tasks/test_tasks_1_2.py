"""Tasks 1-2 end to end: real transformers, a real in-process vLLM engine. Fast on the tiny
model the tests build; on the real packaged model in the lab's quick run (the lab_run fixture,
tests/conftest.py: the last two tests here), task 2 taking task 1's saved baseline and its KV
capacity checked against the arithmetic. Timings are reported by the scripts, never asserted
here: only that they were measured."""
from __future__ import annotations

import pytest

from common import kv, settings, steps
from tests.helpers import (BYTES_PER_TOKEN, QUICK_TOKENS, assert_fits, check_generation, run_script,
                           saved_result)


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
    low, high = sorted(20 / t for t in t1["pass_times_s"])[::2]
    assert step.row(typed) == f"{t1['tokens_per_s']:.1f} tok/s ({low:.1f}-{high:.1f})"


@pytest.mark.engine
def test_task_2_on_the_tiny_model_measures_its_own_baseline(tiny_model):
    """No task 1 result for this model: task 2 measures the baseline itself. (Task 2 taking task
    1's saved result is checked below, on the real model, in the lab's quick run.)"""
    proc = run_script("task_2_vllm_inference.py", "--model", tiny_model, "--dtype", "float32",
                      "--max-tokens", "8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    t2 = saved_result("task_2_vllm_inference")
    check_generation(t2, 8)
    assert t2["baseline"]["source"] == "measured now" and t2["baseline"]["tokens_per_s"] > 0
    assert "No matching task 1 result saved" in proc.stdout
    assert t2["speedup"] > 0 and f"vLLM made {t2['speedup']:.1f}x" in proc.stdout   # by hand:
    # tests/tasks/test_reports.py::test_task2_speedup_by_hand
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
    low, high = sorted(8 / t for t in t2["pass_times_s"])[::2]
    assert step.row(typed) == (f"{t2['tokens_per_s']:.1f} tok/s ({low:.1f}-{high:.1f}), "
                               f"{t2['speedup']:.1f}x")


@pytest.mark.lab_steps("task_1_hf_baseline", "task_2_vllm_inference")
def test_tasks_1_and_2_generate_from_the_real_model(lab_run, real_model):
    assert lab_run.args("task_1_hf_baseline") == ["--max-tokens", "10"]     # --quick's
    t1 = lab_run.saved("task_1_hf_baseline")
    t2 = lab_run.saved("task_2_vllm_inference")
    check_generation(t1, QUICK_TOKENS)
    check_generation(t2, QUICK_TOKENS)
    assert t1["model_path"] == t2["model_path"] == real_model.path
    assert t2["baseline"]["source"].startswith("task 1's saved result")
    assert t2["baseline"]["tokens_per_s"] == t1["tokens_per_s"]
    low, high = sorted(QUICK_TOKENS / t for t in t1["pass_times_s"])[::2]
    assert lab_run.row("task_1_hf_baseline") == (                                   # summary
        f"{t1['tokens_per_s']:.1f} tok/s ({low:.1f}-{high:.1f})")


@pytest.mark.lab_steps("task_2_vllm_inference")
def test_task_2_kv_capacity_on_the_real_model_is_what_the_arithmetic_says(lab_run):
    t2 = lab_run.saved("task_2_vllm_inference")
    # What vLLM allocated for SmolLM's shape in 128 MiB, in blocks of settings.BLOCK_SIZE,
    # read from the engine and derived from the config: equal. By hand, blocks of 16:
    # 134,217,728 // (46,080 B x 16) = 182 blocks, 2,912 tokens, 8 a request: 22.75 in fp32;
    # 364, 5,824, 45.5 in bf16 (23,040 B a token). (SPEC, blocks of 128: 22 / 2,816 / 22.0.)
    derived = kv.derive_capacity(BYTES_PER_TOKEN[t2["dtype"]], settings.KV_CACHE_BYTES,
                                 settings.BLOCK_SIZE, settings.MAX_MODEL_LEN)
    expected = (derived.num_blocks, derived.num_tokens, derived.max_concurrency)
    assert settings.BLOCK_SIZE == 16 and expected == {
        "bfloat16": (364, 5_824, 45.5), "float32": (182, 2_912, 22.75)}[t2["dtype"]]
    engine = t2["kv_capacity_engine"]
    assert (engine["num_blocks"], engine["num_tokens"], engine["max_concurrency"]) == expected
    assert engine["block_size"] == settings.BLOCK_SIZE
    assert t2["kv_capacity_agree"] is True
