"""The whole lab, as `make lab` runs it, end to end on the real packaged model: verify, tasks
1-7, task 8's snapshot and the summary, on a free port (never :8000). Checks what each step
measured, and that every step's peak memory, the vLLM server included, stays in the 3.5 GB
budget of the source's 4 GB VM. (Times are reported, never asserted.)"""
from __future__ import annotations

import pytest

import summary
from common import server
from tests.conftest import run_script, saved_result
from tests.test_server_tasks import free_port, processes_on_port
from tests.test_tasks_1_2 import check_generation


@pytest.mark.real_model
@pytest.mark.engine
def test_the_whole_lab_on_the_real_model(real_model):
    port = free_port()
    try:
        proc = run_script("lab.py", "--port", str(port), timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        assert "Traceback" not in proc.stderr
        run = saved_result("lab_run")
        assert run["completed"] is True
        assert [s["script"] for s in run["steps"]] == [
            "verify_environment.py", "task_1_hf_baseline.py", "task_2_vllm_inference.py",
            "task_3_kv_cache_problem.py", "task_4_paged_attention.py", "task_5_api_server.py",
            "task_6_multi_user_load.py", "task_7_tuning.py", "task_8_dashboard.py"]
        for step in run["steps"]:
            assert step["exit_code"] == 0 and step["seconds"] > 0
            assert 0 < step["peak_memory_bytes"] < summary.MEMORY_BUDGET_BYTES, step
        # tasks 5-8: the script, the API server, its engine core, the engine's worker (and
        # multiprocessing's resource tracker)
        assert all(s["peak_processes"] >= 4 for s in run["steps"][5:])

        assert saved_result("verify_environment")["passed"] == 5
        t1, t2 = saved_result("task_1_hf_baseline"), saved_result("task_2_vllm_inference")
        check_generation(t1)
        check_generation(t2)
        assert t1["model_path"] == t2["model_path"] == real_model.path
        assert t2["baseline"]["source"].startswith("task 1's saved result")
        # What vLLM allocated for SmolLM's shape in 128 MiB (SPEC: 5,760 tokens / 45.00x bf16,
        # 2,816 / 22.00x fp32), read from the engine and derived from the config: equal.
        expected = {"bfloat16": (45, 5_760, 45.0), "float32": (22, 2_816, 22.0)}[t2["dtype"]]
        engine = t2["kv_capacity_engine"]
        assert (engine["num_blocks"], engine["num_tokens"], engine["max_concurrency"]) == expected
        assert t2["kv_capacity_agree"] is True

        t5, t6, t7, t8 = (saved_result(s) for s in ("task_5_api_server", "task_6_multi_user_load",
                                                    "task_7_tuning", "task_8_dashboard"))
        assert t5["server_state"] == "started"
        assert t5["raw_http"]["completion_tokens"] == t5["openai_client"]["completion_tokens"] == 50
        assert [lv["total_tokens"] for lv in t6["levels"]] == [50, 250, 500, 1000]
        assert all(lv["failed"] == 0 for lv in t6["levels"]) and t6["server_state"] == "reused"
        assert t6["sequential"]["total_tokens"] == 1000
        assert [c["kv_max_concurrency"] for c in t7["configs"]] == [expected[2]] * 3
        assert t7["configs"][2]["peak_running"] <= 8
        assert all(c["succeeded"] == 10 for c in t7["configs"])
        # task 8 watches the server task 7 left (config C): every request made exactly 50 tokens
        assert t8["server_state"] == "reused" and "max_num_seqs=8" in t8["engine"]
        assert t8["snapshot"]["e2e_count"] == 11                  # task 7's warm-up + 10
        assert t8["snapshot"]["generation_tokens"] == 50 * 11
        assert float(t8["cache_config"]["kv_cache_max_concurrency"]) == expected[2]

        s = saved_result("summary")
        assert all("not run yet" not in row["figure"] for row in s["rows"])
        assert s["rows"][1]["figure"] == f"{t1['tokens_per_s']:.1f} tok/s"
        assert set(s["roofline"]["placed"]) == {"task_1_hf_baseline", "task_2_vllm_inference",
                                                "task_6_multi_user_load"}
        assert s["roofline"]["num_params"] == 134_515_008
        assert s["lab_run"]["steps"] == run["steps"]
        assert f"still running on :{port}" in proc.stdout
    finally:
        server.stop_server(port)
    assert processes_on_port(port) == []
