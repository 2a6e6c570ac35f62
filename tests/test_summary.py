"""The summary from saved results, the roofline arithmetic (exact on given inputs), and the
peak-memory sampler on real processes."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import summary
from common import memory, results
from common import roofline as rl
from tests.conftest import run_script, saved_result

# SmolLM-135M's config.json (the source's model; SmolLM2-135M has the same shapes)
SMOLLM = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
          "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536,
          "vocab_size": 49152, "tie_word_embeddings": True}
MACHINE = rl.Machine(bandwidth_bytes_s=20e9, flops_s={"float32": 250e9, "bfloat16": 1e12},
                     threads=2)


# --- roofline arithmetic ----------------------------------------------------------------------
def test_model_cost_counts_the_weights():
    cost = rl.model_cost(SMOLLM, "bfloat16", 2)
    assert cost.num_params == 134_515_008   # = sum of numel() of the loaded model (task 0)
    # per layer: q, o 576x576; k, v 576x192; gate, up, down 576x1536 = 3,538,944; + LM head
    assert cost.matmul_params == 30 * 3_538_944 + 49_152 * 576 == 134_479_872
    # matmul weights + 30 x 2 norms of 576 + final norm + one embedding row, 2 bytes each
    assert cost.weight_bytes == (134_479_872 + 30 * 1_152 + 576 + 576) * 2 == 269_031_168
    assert cost.kv_bytes_per_context_token == 23_040   # the source's 22.5 KB per token
    assert cost.bytes_per_token(36) == 269_031_168 + 36 * 23_040
    assert cost.flops_per_token(36) == 2 * 134_479_872 + 36 * 4 * 30 * 9 * 64


def test_untied_embeddings_are_counted_twice_in_params_once_in_matmuls():
    cost = rl.model_cost(SMOLLM | {"tie_word_embeddings": False}, "float32", 4)
    assert cost.num_params == 134_515_008 + 49_152 * 576
    assert cost.matmul_params == 134_479_872
    assert cost.kv_bytes_per_context_token == 46_080


def test_ceilings_on_given_inputs():
    cost = rl.model_cost(SMOLLM, "bfloat16", 2)
    one = rl.ceiling(cost, MACHINE, batch=1, context=36)
    assert one["bound"] == "bandwidth"
    assert one["read_s"] == pytest.approx(269_860_608 / 20e9, rel=1e-12)
    assert one["tokens_per_s"] == pytest.approx(20e9 / 269_860_608, rel=1e-12)      # 74.1
    top = rl.compute_ceiling(cost, MACHINE, context=36)
    assert top == pytest.approx(1e12 / 271_448_064, rel=1e-12)                      # 3,684
    ridge = rl.ridge_batch(cost, MACHINE, context=36)
    assert ridge == pytest.approx((269_031_168 / 20e9) / (271_448_064 / 1e12 - 36 * 23_040 / 20e9),
                                  rel=1e-12)                                        # 58.5
    below, above = (rl.ceiling(cost, MACHINE, b, 36) for b in (58, 59))
    assert (below["bound"], above["bound"]) == ("bandwidth", "compute")
    assert rl.ceiling(cost, MACHINE, 1000, 36)["tokens_per_s"] == pytest.approx(top, rel=1e-12)


def test_tasks_are_placed_under_the_ceilings():
    res = {"task_1_hf_baseline": {"tokens_per_s": 22.0},
           "task_2_vllm_inference": {"tokens_per_s": 33.0},
           "task_6_multi_user_load": {"levels": [{"users": 1, "throughput_tok_s": 20.0},
                                                 {"users": 20, "throughput_tok_s": 200.0}]}}
    cost = rl.model_cost(SMOLLM, "bfloat16", 2)
    r = summary.roofline(res, cost, MACHINE, context=36)
    single = 20e9 / 269_860_608
    assert r["placed"]["task_1_hf_baseline"]["pct_of_bandwidth_ceiling"] == pytest.approx(
        100 * 22.0 / single, rel=1e-12)
    assert r["placed"]["task_2_vllm_inference"]["pct_of_bandwidth_ceiling"] == pytest.approx(
        100 * 33.0 / single, rel=1e-12)
    six = r["placed"]["task_6_multi_user_load"]
    assert six["users"] == 20
    assert six["pct_of_compute_ceiling"] == pytest.approx(100 * 200 / (1e12 / 271_448_064), rel=1e-12)
    # 20 requests: one read of the weights + 20 KV caches, against 20 x the FLOPs
    at20 = 20 / max((269_031_168 + 20 * 36 * 23_040) / 20e9, 20 * 271_448_064 / 1e12)
    assert six["roofline_at_users"]["tokens_per_s"] == pytest.approx(at20, rel=1e-12)


def test_measure_machine_gives_figures():
    machine = rl.measure_machine(threads=2)
    assert machine.bandwidth_bytes_s > 1e8 and machine.threads == 2
    assert set(machine.flops_s) == {"float32", "bfloat16"} and min(machine.flops_s.values()) > 1e8


# --- the summary table from saved results -----------------------------------------------------
def save_lab_results(model: str = "SmolLM2-135M-Instruct", dtype: str = "bfloat16") -> None:
    common = {"model": model, "dtype": dtype}
    results.save("verify_environment", {"passed": 5, "total": 5,
                                        "machine": {"cores": 7, "cpu": "Test CPU"}})
    results.save("task_1_hf_baseline", common | {"tokens_per_s": 21.04})
    results.save("task_2_vllm_inference", common | {"tokens_per_s": 27.96, "speedup": 1.33})
    results.save("task_3_kv_cache_problem", common | {"utilization_pct": 20.3})
    results.save("task_4_paged_attention", common | {"paged": {"utilization_pct": 95.4},
                                                     "users_ratio": 4.8})
    results.save("task_6_multi_user_load", common | {
        "levels": [{"users": 1, "throughput_tok_s": 19.8}, {"users": 20, "throughput_tok_s": 194.4}],
        "scaling_factor": 9.82})
    results.save("task_7_tuning", common | {"configs": [
        {"label": "A: Default", "throughput_tok_s": 149.3},
        {"label": "B: Shorter Context", "throughput_tok_s": 142.3},
        {"label": "C: Limited Concurrency", "throughput_tok_s": 91.5}]})
    results.save("task_8_dashboard", common | {"snapshot": {"e2e_count": 11.0,
                                                            "generation_tokens": 550.0}})


def test_summary_rows_from_saved_results():
    save_lab_results()
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [(r["step"], r["what"], r["figure"]) for r in saved_result("summary")["rows"]]
    assert rows == [
        ("0", "Environment check", "5/5 passed"),
        ("1", "HuggingFace baseline", "21.0 tok/s"),
        ("2", "vLLM, one request", "28.0 tok/s (1.3x)"),
        ("3", "Contiguous KV allocation", "utilisation 20.3%"),
        ("4", "PagedAttention", "utilisation 95.4%, users 4.8x"),
        ("5", "OpenAI-compatible server", "not run yet: python task_5_api_server.py"),
        ("6", "Concurrent users", "20 users 194.4 tok/s (9.8x)"),
        ("7", "Parameter tuning", "A 149.3 / B 142.3 / C 91.5 tok/s"),
        ("8", "Dashboard over /metrics", "550 tokens, 11 requests counted"),
    ]
    assert "Model, dtype:                     SmolLM2-135M-Instruct, bfloat16" in proc.stdout
    assert "Cores (threads):                  2 (this machine)" not in proc.stdout
    assert "Cores (threads):                  7\nCPU:                              Test CPU" \
        in proc.stdout                              # the machine the lab ran on, from its results
    assert "Measured:" in proc.stdout
    assert "Single request: 1.3x. Concurrent requests: 9.8x." in proc.stdout
    assert "NOTE" not in proc.stdout


def test_an_incomplete_result_says_to_rerun_it():
    save_lab_results()
    results.save("task_7_tuning", {"model": "SmolLM2-135M-Instruct", "dtype": "bfloat16"})
    results.save("task_6_multi_user_load", {"levels": [], "scaling_factor": 0})
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    rows = {r["step"]: r["figure"] for r in saved_result("summary")["rows"]}
    assert rows["7"] == "incomplete result: rerun python task_7_tuning.py"
    assert rows["6"] == "incomplete result: rerun python task_6_multi_user_load.py"


def test_roofline_is_placed_with_the_saved_machine_figures(tmp_path):
    """No measuring here: the machine figures saved by the lab are used, so a grader sees the
    learner's ceilings."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM))
    save_lab_results()
    results.save("task_2_vllm_inference", {"model": "m", "dtype": "bfloat16", "model_path": str(model),
                                           "tokens_per_s": 27.96, "speedup": 1.33,
                                           "prompt_tokens": 11, "generated_tokens": 50})
    results.save("task_6_multi_user_load", {"model": "m", "dtype": "bfloat16", "scaling_factor": 9.8,
                                            "levels": [{"users": 1, "throughput_tok_s": 20.0,
                                                        "mean_tpot_s": 0.05},
                                                       {"users": 20, "throughput_tok_s": 200.0,
                                                        "mean_tpot_s": 0.1}]})
    results.save("machine", {"bandwidth_bytes_s": 20e9, "threads": 2, "host": "learner-vm",
                             "flops_s": {"float32": 250e9, "bfloat16": 1e12},
                             "matmul_n": {"float32": 1024, "bfloat16": 1024}})
    proc = run_script("summary.py")
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = saved_result("summary")["roofline"]
    # context 11 + 50 // 2 = 36 tokens: the figures of test_ceilings_on_given_inputs
    assert r["context"] == 36 and r["bytes_per_token"] == 269_860_608
    assert r["bandwidth_ceiling_tok_s"] == pytest.approx(20e9 / 269_860_608, rel=1e-12)
    assert "on learner-vm" in proc.stdout
    assert "1-request ceiling (tok/s):        74.1 = bandwidth / bytes per token" in proc.stdout
    assert "Compute ceiling (tok/s):          3,684 = bfloat16 matmul" in proc.stdout
    assert "  vLLM, 1 request:                27.96 tok/s" not in proc.stdout
    assert "  vLLM, 1 request:                28.0 tok/s = 38% of the bandwidth ceiling" in proc.stdout
    assert "  server, 20 users:               200.0 tok/s = 5.4% of the compute ceiling" in proc.stdout
    # the server's measured step: 50 ms for 1 request, 100 ms for 20 (10x the tok/s, 2x the time)
    assert "took 50 ms for 1 request and 100 ms for 20: 10.0x the tokens/s for 2.0x" in \
        " ".join(proc.stdout.split())


def test_summary_flags_steps_that_ran_another_model():
    save_lab_results()
    results.save("task_1_hf_baseline", {"model": "/models/other", "dtype": "float32",
                                        "tokens_per_s": 15.0})
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0
    assert "NOTE: task_1_hf_baseline ran other, float32" in proc.stdout


def test_summary_shows_time_and_memory_of_the_last_lab_run():
    save_lab_results()
    results.save("lab_run", {"total_seconds": 250.0, "completed": True, "steps": [
        {"script": "task_1_hf_baseline.py", "seconds": 12.5, "peak_memory_bytes": 1_100_000_000,
         "peak_processes": 1},
        {"script": "task_6_multi_user_load.py", "seconds": 70.0,
         "peak_memory_bytes": 3_600_000_000, "peak_processes": 4}]})
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0
    assert re.search(r"\ntask_1_hf_baseline.py +12.5 +1.10 +1\n", proc.stdout)
    assert re.search(r"\ntask_6_multi_user_load.py +70.0 +3.60 OVER +4\n", proc.stdout)
    assert "Total time (min):                 4.2" in proc.stdout


# --- peak memory --------------------------------------------------------------------------------
HOLD = "import sys, time; b = bytearray({n} * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); " \
       "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(1.5)"


def test_peak_memory_counts_the_children_too():
    code = (f"import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', "
            f"{HOLD.format(n=200)!r}]); " + HOLD.format(n=100) + "; child.wait()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    with memory.PeakMemory(proc.pid, interval_s=0.05) as peak:
        proc.wait()
    # 300 MiB touched by the two processes, plus two Python interpreters (~10 MB each)
    assert 300 * 2**20 < peak.peak_bytes < 300 * 2**20 + 100e6
    assert peak.peak_processes == 2 and peak.num_samples > 5


def test_pss_of_a_gone_process_is_zero():
    assert memory.pss_bytes(2**22 + 12345) == 0


def test_lab_run_refuses_bad_flags():
    proc = run_script("lab.py", "--port", "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("'x' is not a whole number (see --help)")


def test_peak_memory_counts_the_lab_server_an_earlier_step_started(tmp_path, monkeypatch):
    """A server started by task 5 is no child of task 6, yet task 6's peak includes it: it is
    found through <cache>/server-<port>.json, as the lab server is."""
    monkeypatch.setenv("LAB_CACHE_DIR", str(tmp_path))
    # what the lab checks before it counts a process group as its server: the command line
    fake_server = subprocess.Popen([sys.executable, "-c", HOLD.format(n=150).replace("1.5", "5"),
                                    "vllm.entrypoints.openai.api_server", "--port", "8123"],
                                   stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert fake_server.stdout.readline() == b"ready\n"
        (tmp_path / "server-8123.json").write_text(f'{{"pid": {fake_server.pid}}}')
        step = subprocess.Popen([sys.executable, "-c", HOLD.format(n=50)], stdout=subprocess.PIPE)
        with memory.PeakMemory(step.pid, server_port=8123, interval_s=0.05) as with_server:
            step.wait()
        step = subprocess.Popen([sys.executable, "-c", HOLD.format(n=50)], stdout=subprocess.PIPE)
        with memory.PeakMemory(step.pid, server_port=8124, interval_s=0.05) as without:
            step.wait()
    finally:
        fake_server.kill()
        fake_server.wait()
    assert 200 * 2**20 < with_server.peak_bytes < 200 * 2**20 + 100e6
    assert with_server.peak_processes == 2
    assert 50 * 2**20 < without.peak_bytes < 50 * 2**20 + 60e6
