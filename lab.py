"""The whole lab in one command (`make lab`): verify_environment.py, tasks 1-7 and task 8's
one-snapshot form, each run as a learner runs it, one after another, then the summary.

Each step's wall time and peak memory (PSS of the script, its children and the lab's vLLM server,
which tasks 5-8 share) are measured and saved to results/lab_run.json, for the summary. A lab
server left from an earlier run is stopped first, so task 5 starts one and every step is measured
from the same clean state. The lab stops at the first step that fails. The vLLM server stays up
at the end for the dashboard (`make stop`); on Ctrl-C it is stopped.

    python lab.py [--port 8000]
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import summary
from common import cli, memory, results, server, settings

SCRIPT = "lab_run"


def steps(port: int) -> list[list[str]]:
    return [["verify_environment.py"], ["task_1_hf_baseline.py"], ["task_2_vllm_inference.py"],
            ["task_3_kv_cache_problem.py"], ["task_4_paged_attention.py"],
            ["task_5_api_server.py", "--port", str(port)],
            ["task_6_multi_user_load.py", "--port", str(port)],
            ["task_7_tuning.py", "--port", str(port)],
            ["task_8_dashboard.py", "--once", "--server-port", str(port)]]


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                        help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    return parser.parse_args(argv)


def run_step(command: list[str], port: int) -> dict:
    """Run one script (its report goes straight to the terminal) and measure it."""
    print(f"\n>>> python {' '.join(command)}", flush=True)
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *command], cwd=settings.REPO_DIR)
    with memory.PeakMemory(proc.pid, server_port=port) as peak:
        try:
            code = proc.wait()
        except KeyboardInterrupt:   # pass it on (a terminal's Ctrl-C reaches both of us anyway)
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
    return {"script": command[0], "args": command[1:], "exit_code": code,
            "seconds": round(time.perf_counter() - start, 1),
            "peak_memory_bytes": peak.peak_bytes, "peak_processes": peak.peak_processes}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if server.stop_server(args.port):
        print(f"Stopped the lab's vLLM server left on :{args.port} by an earlier run: the lab "
              f"measures every step from a clean start.")
    start = time.perf_counter()
    commands, done = steps(args.port), []
    try:
        for command in commands:
            done.append(run_step(command, args.port))
            if done[-1]["exit_code"] != 0:
                break
    except KeyboardInterrupt:
        server.stop_server(args.port)
        raise
    data = {"port": args.port, "total_seconds": round(time.perf_counter() - start, 1),
            "steps": done, "completed": all(s["exit_code"] == 0 for s in done)
            and len(done) == len(commands)}
    results.save(SCRIPT, data)
    if not data["completed"]:
        cli.fail(f"{done[-1]['script']} exited with code {done[-1]['exit_code']}; the lab stops "
                 f"here (its output is above)", code=1)
    print()
    summary.main(["--measure"])
    stop = "make stop" if args.port == settings.SERVER_PORT else \
        f"python -m common.server stop --port {args.port}"
    print(f"The vLLM server is still running on :{args.port}; stop it with: {stop}")
    return data


if __name__ == "__main__":
    cli.run(main)
