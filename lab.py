"""The whole lab in one command (`make lab`): every step of common/steps.py, then the summary.
The steps (verify_environment.py, then each task in order; task 8 in its one-snapshot form) run
one after another, each as a learner runs it, and the summary (summary.py) after them, once this
run is saved; results/report.html (common/html_report.py: every step's report and figures on one
page) comes last. Each report goes to the terminal as it prints and to results/<script>.txt, for
that page.

Each step's wall time and peak memory (PSS of the script, its children and the lab's vLLM server,
which the server tasks share) are measured and saved to results/lab_run.json, for the summary. A
lab server left from an earlier run is stopped first, so task 5 starts one and every step is
measured from the same clean state. The lab stops at the first step that fails, says which,
stops the vLLM server and exits 1. The server is stopped before each step that runs engines of
its own (own_engines in common/steps.py; `make dashboard` starts one again); on Ctrl-C it is
stopped. Task 8's snapshot is taken while 20 requests run on the server task 7 left.

    python lab.py [--port 8000] [--quick]
"""
from __future__ import annotations

import argparse
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

from common import cli, html_report, memory, report, results, server, settings
from common import steps as lab_steps

SCRIPT = "lab_run"


# The steps that run engines of their own (own_engines in common/steps.py): the lab's server
# that the steps before them shared is stopped before each, so its memory is not theirs.
OWN_ENGINES = {step.script for step in lab_steps.STEPS if step.own_engines}


def steps(port: int, quick: bool = False) -> list[list[str]]:
    """The command of every step of the lab, in order (common/steps.py: the one list)."""
    return [step.command(port, quick) for step in lab_steps.STEPS]


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=cli.port_number, default=settings.SERVER_PORT,
                        help=f"port of the lab's vLLM server (default {settings.SERVER_PORT})")
    parser.add_argument("--quick", action="store_true",
                        help="every step with a small workload (about half the time): a check "
                             "that the lab runs, not figures to compare")
    # For the tests (not in --help): run only these steps, comma-separated: a script of the lab's
    # list runs with its usual arguments, any other path runs as it is (e.g. one that fails).
    # --quick: the same steps on the same model with small workloads (each step's quick_args),
    # so every script runs end to end in about half the time (the test suite's end-to-end run).
    # Its figures are a check that the lab works, not measurements to compare.
    parser.add_argument("--steps", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def chosen_steps(port: int, names: str | None, quick: bool = False) -> list[list[str]]:
    """The lab's steps, or only those named by --steps (see parse_args)."""
    commands = steps(port, quick)
    if names is None:
        return commands
    by_script = {command[0]: command for command in commands}
    return [by_script.get(name, [name]) for name in names.split(",")]


def report_path(script: str) -> Path:
    """results/<script>.txt: the step's report as printed, for results/report.html."""
    return settings.results_dir() / f"{Path(script).stem}.txt"


def detail_path(script: str) -> Path:
    """results/<script>.detail.txt: what the step's report left out of the terminal (each pass,
    each request), for results/report.html (common.report.detail)."""
    return settings.results_dir() / f"{Path(script).stem}.detail.txt"


def log_path(script: str) -> Path:
    """results/logs/<script>.log: what the step wrote to stderr (the libraries' progress bars
    and warnings), kept out of its report."""
    return settings.results_dir() / "logs" / f"{Path(script).stem}.log"


def keep_errors(pipe, path: Path) -> None:
    """Copy a step's stderr to path; only the lab's own words (one ERROR line, a HINT) go on to
    the terminal too, so a failure still reads as one line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as log:
        for line in pipe:
            log.write(line)
            log.flush()
            if line.startswith(("ERROR:", "---> HINT")):
                sys.stderr.write(line)
                sys.stderr.flush()


def tee(pipe, path: Path) -> None:
    """Copy a step's output to the terminal as it comes (a partial line too: progress lines
    end with flush) and to path. Its errors (stderr) go to the terminal only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as log:
        while chunk := os.read(pipe.fileno(), 65536):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
            log.write(chunk)


def run_step(command: list[str], port: int) -> results.LabStepRun:
    """Run one step of the list, said first as the command a learner types (>>> python ...)."""
    print()
    report.note(f">>> python {' '.join(command)}", hang=4)
    return run_script(command, port)


def run_script(command: list[str], port: int) -> results.LabStepRun:
    """Run one script (its report goes to the terminal as it prints, and to results/<script>.txt;
    its stderr to results/logs/<script>.log) and measure it."""
    start = time.perf_counter()
    detail = detail_path(command[0])
    detail.unlink(missing_ok=True)
    # unbuffered: through a pipe, Python would hold the report back in blocks
    proc = subprocess.Popen([sys.executable, *command], cwd=settings.REPO_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=False,
                            env={**os.environ, "PYTHONUNBUFFERED": "1",
                                 report.DETAIL_TO: str(detail)})
    copier = threading.Thread(target=tee, args=(proc.stdout, report_path(command[0])),
                              daemon=True)
    errors = threading.Thread(target=keep_errors, daemon=True,
                              args=(io.TextIOWrapper(proc.stderr, errors="replace"),
                                    log_path(command[0])))
    copier.start()
    errors.start()
    with memory.PeakMemory(proc.pid, server_port=port) as peak:
        try:
            code = proc.wait()
        except KeyboardInterrupt:   # pass it on (a terminal's Ctrl-C reaches both of us anyway)
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
    copier.join(timeout=10)   # the rest of its output (a process it left may hold the pipe)
    errors.join(timeout=10)
    return results.LabStepRun(script=command[0], args=command[1:], exit_code=code,
                              seconds=round(time.perf_counter() - start, 1),
                              peak_memory_bytes=peak.peak_bytes,
                              peak_processes=peak.peak_processes)


def main(argv: list[str] | None = None) -> results.LabRun:
    args = parse_args(argv)
    stop_a_server_left_running(args.port)
    forget_the_last_run()
    start = time.perf_counter()
    commands = chosen_steps(args.port, args.steps, args.quick)
    done, stopped_before = run_steps(commands, args.port)
    run = results.LabRun(port=args.port, quick=args.quick,
                         total_seconds=round(time.perf_counter() - start, 1), steps=done,
                         completed=all(s.exit_code == 0 for s in done)
                         and len(done) == len(commands))
    results.save(SCRIPT, run)
    if not run.completed:
        stop_at_the_failed_step(run)
    summary = run_summary(args.port)
    write_report(args.port)
    say_where_the_server_is(stopped_before, args.port)
    if summary.exit_code != 0:
        report.path_line("Its stderr (the libraries' messages)", log_path(summary.script))
        cli.fail(f"the lab's steps ran, but {summary.script} exited with code "
                 f"{summary.exit_code} (its output is above)", code=1)
    return run


def forget_the_last_run() -> None:
    """This run measures the machine's ceilings once, at the first step that reads them, and
    every later step and the summary read that one figure (common/machine.machine_figures);
    what ran is printed in full once, then only what differs (common/report.run_info)."""
    settings.results_dir().joinpath("machine.json").unlink(missing_ok=True)
    report.forget_what_ran()


def stop_a_server_left_running(port: int) -> None:
    """A lab server left from an earlier run is stopped, so every step starts from the same
    clean state (task 5 starts the lab's server again)."""
    if server.stop_server(port):
        report.note(f"Stopped the lab's vLLM server left on :{port} by an earlier run: the "
                    f"lab measures every step from a clean start.")


def run_steps(commands: list[list[str]], port: int
              ) -> tuple[list[results.LabStepRun], str | None]:
    """Run the steps in order, up to the first that fails. The server the steps before share is
    stopped before a step that runs engines of its own (its memory is not that step's), and on
    Ctrl-C. Returns what ran, and the step before which the server was stopped (None: never)."""
    done, stopped_before = [], None
    try:
        for command in commands:
            if command[0] in OWN_ENGINES and server.stop_server(port):
                print()   # a note's text is wrapped: a newline in it would become a space
                report.note(f"Stopped the lab's vLLM server on :{port}: "
                            f"{command[0]} runs engines of its own.")
                stopped_before = stopped_before or command[0]
            done.append(run_step(command, port))
            if done[-1].exit_code != 0:
                break
    except KeyboardInterrupt:
        server.stop_server(port)
        raise
    return done, stopped_before


def stop_at_the_failed_step(run: results.LabRun) -> NoReturn:
    """A failed lab leaves nothing running: the server stopped, the page written with what was
    saved, one line naming the step, exit 1."""
    stopped = server.stop_server(run.port)
    write_report(run.port)
    failed = run.steps[-1]
    report.path_line("Its stderr (the libraries' messages)", log_path(failed.script))
    cli.fail(f"{failed.script} exited with code {failed.exit_code}; the lab stops "
             f"here (its output is above)"
             + (f"; the vLLM server it started on :{run.port} is stopped" if stopped else ""),
             code=1)


def run_summary(port: int) -> results.LabStepRun:
    """The summary (common/steps.py: SUMMARY), run as the steps are, after them: it reads this
    run (results/lab_run.json, saved just before) and the machine's figures it measured once
    (results/machine.json); its report to the terminal and to results/summary.txt, for the
    report page."""
    print()
    return run_script(lab_steps.SUMMARY.command(port), port)


def say_where_the_server_is(stopped_before: str | None, port: int) -> None:
    """The closing note: the lab's server is still running (and how to stop it), or the lab
    stopped it before the first step with engines of its own; nothing when no server was left
    between the steps (the tests' --steps of such steps only: each stops what it starts)."""
    if server.lab_server_pid(port) is not None:
        stop = "make stop" if port == settings.SERVER_PORT else \
            f"python -m common.server stop --port {port}"
        report.note(f"The vLLM server is still running on :{port}; stop it with: {stop}")
    elif stopped_before:
        report.note(f"The lab's vLLM server was stopped before "
                    f"{lab_steps.by_name()[Path(stopped_before).stem].label}; `make dashboard` "
                    "starts one again for the live page.")


def write_report(port: int) -> None:
    """results/report.html from what the steps saved, every step of the lab in its order (a step
    not run says so); a page that cannot be written is one line, not a failed lab."""
    try:
        report.path_line("Report", html_report.write())
    except OSError as e:
        report.note(f"Report: not written ({type(e).__name__}: {e})")


if __name__ == "__main__":
    cli.run(main)
