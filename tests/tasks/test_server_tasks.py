"""Tasks 5-6 against a real vLLM server on the tiny model, on a free port (never :8000): start,
reuse, a busy port, stop, Ctrl-C while starting; both clients of task 5; task 6's counts and
failures; --base-url; the cross-check with `vllm bench serve` on the same server. (The real
packaged model runs them in the lab's quick run, the whole lab end to end: the lab_run fixture,
tests/conftest.py, checked by the last test here; task 7's restarts for its three configs are
checked there too, in tests/tasks/test_tasks_6_7.py: a restart costs the same ~30 s on any
model.)"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from common import load, memory, server, steps
from common.server import free_port
from tests.helpers import (QUICK_TOKENS, REPO, assert_fits, assert_says, processes_on_port,
                           row_value, run_script, saved_result)

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def port():
    p = free_port()
    yield p
    server.stop_server(p)
    assert processes_on_port(p) == []


def test_task5_starts_then_reuses_and_both_clients_answer(tiny_model, port):
    args = ["--model", tiny_model, "--dtype", "float32", "--port", str(port), "--max-tokens", "12"]
    proc = run_script("task_5_api_server.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    r = saved_result("task_5_api_server")
    assert r["server_state"] == "started" and r["startup_s"] > 0
    assert r["base_url"] == f"http://127.0.0.1:{port}"
    for client in ("raw_http", "openai_client"):
        assert r[client]["completion_tokens"] == 12 and r[client]["latency_s"] > 0
        assert r[client]["prompt_tokens"] > 0
    assert_says(row_value(proc.stdout, "Server"), "(PID", branch="started", not_branch="external")
    assert "RESPONSE: official openai client" in proc.stdout   # the second client's section
    assert "stop it with `make stop`" in " ".join(proc.stdout.split())
    step = steps.by_name()["task_5_api_server"]              # read back typed, as the summary
    typed = step.load()
    assert typed.openai_client.completion_tokens == 12 and typed.settings.max_tokens == 12
    # the first request timed apart; then 3 passes of each in turns, the median pass kept whole
    assert r["first_request"]["completion_tokens"] == 12
    for client, passes in (("raw_http", "raw_latency"), ("openai_client", "sdk_latency")):
        spread = r[passes]
        assert spread["num_passes"] == 3 and spread["median"] == r[client]["latency_s"]
        assert 0 < spread["low"] <= spread["median"] <= spread["high"]
    spread = r["raw_latency"]
    assert step.row(typed) == (f"/v1/completions, {spread['median']:.2f} s "
                               f"({spread['low']:.2f}-{spread['high']:.2f})")
    assert_fits(proc.stdout)
    assert proc.stdout.count("\nModel:") == 1                # the model row once per report

    proc = run_script("task_5_api_server.py", *args)
    assert proc.returncode == 0
    assert saved_result("task_5_api_server")["server_state"] == "reused"
    assert_says(row_value(proc.stdout, "Server"), "(PID", branch="reused",
                not_branch=("started", "external"))


def test_task5_prompt_too_long_is_one_line(tiny_model, port):
    proc = run_script("task_5_api_server.py", "--model", tiny_model, "--dtype", "float32",
                      "--port", str(port), "--prompt", "word " * 300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ERROR: the server refused the request: HTTP 400")
    assert "maximum context length is 128 tokens" in lines[0]


def test_task6_counts_tokens_and_users(tiny_model, port):
    proc = run_script("task_6_multi_user_load.py", "--model", tiny_model, "--dtype", "float32",
                      "--port", str(port), "--users", "1,3,6", "--max-tokens", "10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_fits(proc.stdout)
    assert_says(row_value(proc.stdout, "Load test plan"), "1, 3, 6 concurrent")     # no list
    assert "KEY INSIGHT:" in proc.stdout and "[1, 3, 6]" not in proc.stdout
    r = saved_result("task_6_multi_user_load")
    assert r["server_state"] == "reused"
    assert [lv["num_users"] for lv in r["levels"]] == [1, 3, 6] == r["users_per_level"]
    assert [lv["num_output_tokens"] for lv in r["levels"]] == [10, 30, 60]
    assert all(lv["errors"] == [] and lv["num_ok"] == lv["num_users"] for lv in r["levels"])
    for lv in r["levels"]:
        assert 0 < lv["mean_ttft_s"] <= lv["mean_latency_s"]
        assert lv["p50_latency_s"] <= lv["p95_latency_s"]
    assert r["sequential"]["num_users"] == 6 and r["sequential"]["num_output_tokens"] == 60
    assert r["sequential"]["is_concurrent"] is False
    # the factor's arithmetic is checked by hand in tests/tasks/test_reports.py; here, that the
    # report prints what was saved
    assert f"Scaling factor:                   {r['scaling_factor']:.1f}x" in proc.stdout
    # one request alone, two ways: the 1-user level's 3 passes, the 6 sequential requests; the
    # factor divides by the one the report names
    # (twins: they agree when their medians are within measure.AGREE_WITHIN, not their ranges)
    from common import measure

    alone = r["alone"]
    assert alone["level"]["num_passes"] == 3 and alone["sequential"]["num_passes"] == 6
    agree = measure.within(alone["level"]["median"], alone["sequential"]["median"])
    assert alone["used"] == ("the 1-user level" if agree else "the sequential requests")
    assert_says(" ".join(proc.stdout.split()),
                "they agree" if agree else "they DISAGREE",
                "The baseline is the 1-user level" if agree else
                "The baseline is the sequential requests")
    # the sequential requests' wait in line for their first token, measured: each waited for
    # the ones before it, so on average more than one request's whole latency alone
    assert r["sequential_in_line_ttft_s"] > r["sequential"]["mean_latency_s"]
    peak = max(lv["tokens_per_s"] for lv in r["levels"])
    assert r["scaling_factor"] == pytest.approx(peak / alone["tokens_per_s"])
    # the engine core's own step, from the server's /metrics around each level: above zero
    # and within what the client measured of the same tokens (it is a part of it)
    for lv in [*r["levels"], r["sequential"]]:
        assert 0 < lv["engine_itl_s"] <= lv["mean_latency_s"]
    assert re.search(r"\n +6 +[\d.]+ +[\d.]+ +[\d.]+\n", proc.stdout)   # its table's row


def test_the_server_runs_its_worker_in_the_engine_core(port):
    """settings.ENGINE_ENV (VLLM_ENABLE_V1_MULTIPROCESSING=0) reaches the server: 3 processes,
    the API server, the engine core holding the worker, and multiprocessing's resource tracker
    (vLLM's default runs the worker in a fourth)."""
    pid = server.lab_server_pid(port)
    assert memory.server_memory(pid)[1] == 3
    with open(f"/proc/{pid}/environ", "rb") as f:
        assert b"VLLM_ENABLE_V1_MULTIPROCESSING=0" in f.read().split(b"\0")
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=0" in server.running_config(port).describe()


def test_tasks_5_and_6_against_a_server_given_by_base_url(tiny_model, port):
    """--base-url: the server the test started, used as any OpenAI-compatible server: the lab
    neither starts, restarts nor stops it, and reads the model from its /v1/models."""
    url = f"http://127.0.0.1:{port}/v1"           # the OpenAI SDK's form, /v1 included
    config = server.running_config(port)
    proc = run_script("task_5_api_server.py", "--base-url", url, "--max-tokens", "6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = saved_result("task_5_api_server")
    assert (r["server_state"], r["base_url"], r["model"]) == (
        "external", f"http://127.0.0.1:{port}", config.model_name)
    assert r["raw_http"]["completion_tokens"] == r["openai_client"]["completion_tokens"] == 6
    assert_says(row_value(proc.stdout, "Server"), branch="external (--base-url)",
                not_branch=("(PID", "started (", "reused ("))
    proc = run_script("task_6_multi_user_load.py", "--base-url", url, "--users", "1,2",
                      "--max-tokens", "5", "--no-sequential")
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = saved_result("task_6_multi_user_load")
    assert r["server_state"] == "external" and r["model_source"] == "external"
    assert [lv["num_output_tokens"] for lv in r["levels"]] == [5, 10] and "sequential" not in r
    assert "server_config" not in r                  # not the lab's server: no settings to say
    assert_fits(proc.stdout)
    assert server.running_config(port) == config               # the same server, untouched


def test_a_refused_request_is_counted_as_failed(port):
    config = server.running_config(port)
    level = load.run_level(f"http://127.0.0.1:{port}", config.model_name,
                           ["User 1: explain a KV cache.", "word " * 300], max_tokens=8)
    assert (len(level.ok), level.num_failed, level.num_output_tokens) == (1, 1, 8)
    assert level.num_ok == 1 and level.errors[0].startswith("HTTP 400")


def test_cross_check_runs_vllm_bench_serve_on_the_same_load(tiny_model, port):
    proc = run_script("benchmarks/cross_check.py", "--model", tiny_model, "--dtype", "float32",
                      "--port", str(port), "--users", "4", "--max-tokens", "10")
    r = saved_result("benchmark_cross_check")
    # the tiny model's runs take a fraction of a second, so they may differ by more than the
    # bound; either way the exit code says which (1: outside it, with one line saying so)
    assert proc.returncode == (0 if r["is_within_bound"] else 1), proc.stderr[-3000:]
    if not r["is_within_bound"]:
        assert proc.stderr.strip().splitlines()[-1].startswith("ERROR: the two measurements "
                                                               "differ by")
    assert r["vllm_bench_serve"]["num_completed"] == r["task6"]["num_ok"] == 4
    assert r["vllm_bench_serve"]["total_output_tokens"] == r["task6"]["num_output_tokens"] == 40
    assert r["vllm_bench_serve"]["output_tokens_per_s"] > 0 and r["input_len_tokens"] > 0
    assert "Output throughput differs by" in proc.stdout   # the figure, whichever the verdict
    assert_fits(proc.stdout)


def test_busy_port_is_refused_and_left_alone(tiny_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        proc = run_script("task_5_api_server.py", "--model", tiny_model, "--port", str(busy))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.strip() == (f"ERROR: port {busy} is in use by another program (not a "
                                       f"server this lab started); stop it or choose another --port")
        assert s.fileno() != -1


def test_ctrl_c_while_starting_leaves_no_process(tiny_model):
    p = free_port()
    proc = subprocess.Popen([sys.executable, "task_5_api_server.py", "--model", tiny_model,
                             "--port", str(p)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(pid != proc.pid for pid in processes_on_port(p)):   # the server is starting
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err
    assert "interrupted" in err
    assert processes_on_port(p) == []
    assert server.running_config(p) is None


def test_stop_stops_only_the_lab_server(port):
    assert processes_on_port(port)
    out = subprocess.run([sys.executable, "-m", "common.server", "stop", "--port", str(port)],
                         cwd=REPO, capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == f"Stopped the lab's vLLM server on :{port}."
    assert processes_on_port(port) == []


@pytest.mark.parametrize("script, args, message", [
    ("task_7_tuning.py", ["--base-url", "http://127.0.0.1:9"], "task 7 restarts the server"),
    ("task_6_multi_user_load.py", ["--users", "1,x"], "'x' is not a whole number"),
    ("task_6_multi_user_load.py", ["--base-url", "http://127.0.0.1:9"],
     "no OpenAI-compatible server answers at http://127.0.0.1:9/v1/models"),
    ("task_5_api_server.py", ["--port", "-1"], "'-1' must be greater than 0"),
])
def test_bad_server_input_is_one_line(script, args, message):
    proc = run_script(script, *args)
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_engine_args_reach_the_command_the_description_and_the_reuse_check(tmp_path, monkeypatch):
    """A task's own engine flags (task 11's budget) start the server with them, show in what the
    report prints, and survive the state file, so a server with other flags is not reused."""
    config = server.ServerConfig("/m", "m", "float32", port=8321,
                                 engine_args=("--max-num-batched-tokens", "128",
                                              "--no-enable-chunked-prefill"))
    assert config.command()[-3:] == ["--max-num-batched-tokens", "128",
                                     "--no-enable-chunked-prefill"]
    assert_says(config.describe(), "enforce_eager=True",
                "--max-num-batched-tokens 128 --no-enable-chunked-prefill",
                "VLLM_ENABLE_V1_MULTIPROCESSING")
    assert "--max" not in server.ServerConfig("/m", "m", "float32").describe()
    monkeypatch.setenv("LAB_SERVER_DIR", str(tmp_path))
    import dataclasses
    import json

    (tmp_path / "server-8321.json").write_text(json.dumps(
        {"pid": os.getpid(), "config": dataclasses.asdict(config)}))
    monkeypatch.setattr(server, "_is_lab_server", lambda pid, port: True)
    assert server.running_config(8321) == config
    assert server.running_config(8321) != dataclasses.replace(config, engine_args=())


@pytest.mark.lab_steps("task_5_api_server", "task_6_multi_user_load")
def test_tasks_5_and_6_talk_to_the_lab_server_on_the_real_model(lab_run):
    port = str(lab_run.port)
    assert lab_run.args("task_6_multi_user_load") == [                     # --quick's
        "--port", port, "--users", "1,20", "--max-tokens", "10", "--no-sequential"]
    t5 = lab_run.saved("task_5_api_server")
    t6 = lab_run.saved("task_6_multi_user_load")
    assert t5["server_state"] == "started"
    assert t5["raw_http"]["completion_tokens"] == \
        t5["openai_client"]["completion_tokens"] == QUICK_TOKENS
    assert [lv["num_output_tokens"] for lv in t6["levels"]] == [QUICK_TOKENS,
                                                                20 * QUICK_TOKENS]
    assert all(lv["num_ok"] == lv["num_users"] for lv in t6["levels"])
    assert t6["server_state"] == "reused"
    # the quick lab keeps the passes: 3 of each client, 3 of each level, in turns
    assert t5["raw_latency"]["num_passes"] == t5["sdk_latency"]["num_passes"] == 3
    assert t6["num_passes"] == 3 and [s["num_passes"] for s in t6["spreads"]] == [3, 3]
    assert [s["median"] for s in t6["spreads"]] == [lv["tokens_per_s"] for lv in t6["levels"]]
