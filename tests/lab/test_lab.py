"""The whole lab end to end on the real packaged model: every step of common/steps.py and the
summary, as `python lab.py --quick` runs them (small workloads: the same code paths as `make lab`
in about half the time; `make lab` itself is timed in docs/measurements.md), on free ports
(never :8000). The lab runs once, for the whole session, in two parts, one on each worker (its
hidden --steps): the steps up to task 9, which share the lab's server, then the rest, which each
start their own (tests/conftest.py: lab_parts, and the fixtures lab_run and whole_lab).

This file holds the lab-wide checks, each going over common/steps.py: every step ran to the end
in the order of the list with its --quick arguments, every step's peak memory, the vLLM server
included, stays in the 3.5 GB budget of the source's 4 GB VM, the server is stopped before the
steps that run engines of their own, the summary has a row for every step and the roofline,
every report is saved, and nothing is left on the lab's ports. (Times are reported, never
asserted.) What each step measured is checked in that step's own test file, by a test taking
lab_run and naming its steps (@pytest.mark.lab_steps; test_faults.py: verify_environment's;
test_tasks_1_2.py: tasks 1-2 and task 2's KV capacity; test_server_tasks.py: 5-6;
test_tasks_6_7.py: 7; test_task_8.py: 8; test_task_<N>.py from 9 on), so a new task adds its
own there and nothing here.

Each concern is a test of its own, so a failure names what broke and hides nothing else. These
take whole_lab: tests/conftest.py marks them real_model and runs them last, when both parts are
done."""
from __future__ import annotations

import os
from pathlib import Path

import lab
from common import report, results, server, steps
from lessons.summary import report as printed
from tests.helpers import REPO, assert_fits, processes_on_port, run_script, saved_result


def test_every_task_is_one_entry_of_the_steps_list_and_named_in_the_readme():
    """Adding a task is one script, its package under lessons/ and one entry in common/steps.py:
    make lab, the summary, the figures and the report page all read that list, and the README
    names the script."""
    scripts = sorted(p.name for p in REPO.glob("task_*.py"))
    listed = [step.script for step in steps.STEPS]
    assert sorted(s for s in listed if s.startswith("task_")) == scripts
    assert listed[0] == "verify_environment.py" and len(set(listed)) == len(listed)
    readme = (REPO / "README.md").read_text()
    assert [s for s in scripts if s not in readme] == []
    for step in steps.STEPS:
        assert (REPO / step.script).exists(), step.script
        # what the lab reads back from its lesson's package: its record, its summary row
        assert issubclass(step.record, results.Result), step.script
        assert callable(step.lesson.summary_row), step.script
    # the summary's table is numbered as the tasks are: 0 (the check), then 1, 2, 3, ...
    assert [step.number for step in steps.STEPS] == [str(i) for i in range(len(steps.STEPS))]
    assert lab.steps(8000) == [step.command(8000) for step in steps.STEPS]
    assert lab.steps(8000, quick=True) == [step.command(8000, quick=True) for step in steps.STEPS]
    # the server's port goes to the steps that talk to it, and only there (as --port, or task
    # 8's --server-port); the steps that run engines of their own are the lab's OWN_ENGINES
    assert [c for c in lab.steps(8123) if "8123" in c] == [
        step.command(8123) for step in steps.STEPS if steps.PORT in step.args]
    assert all(c[c.index("8123") - 1] in ("--port", "--server-port")
               for c in lab.steps(8123) if "8123" in c)
    assert lab.OWN_ENGINES == {step.script for step in steps.STEPS if step.own_engines}


def test_the_summary_runs_after_the_steps_as_a_step_does(tmp_path):
    """lab.py runs the summary (common/steps.py: SUMMARY) after the steps, once their run is
    saved, as a process of its own like every step: its report to the terminal and to
    results/summary.txt, its stderr to results/logs/summary.log; it reads the run just saved."""
    step = tmp_path / "a_step.py"
    step.write_text("print('a step that ran')\n")
    proc = run_script("lab.py", "--port", str(server.free_port()), "--steps", str(step))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    saved = Path(os.environ["LAB_RESULTS_DIR"])
    text = (saved / "summary.txt").read_text()
    assert "Summary: the vLLM lab, step by step" in text and text in proc.stdout
    assert proc.stdout.index("a step that ran") < proc.stdout.index(text)
    assert (saved / "logs" / "summary.log").is_file()
    assert [s["script"] for s in saved_result("summary")["lab_run"]["steps"]] == [str(step)]


# --- the lab's run, lab-wide: one test per concern, in the order the lab runs its steps ---------
def test_the_lab_runs_every_step_to_the_end(whole_lab):
    """Its parts (helpers.lab_parts) ran every step of the list, in its order, to the end."""
    bars = []
    for part in whole_lab:
        proc = part.proc
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        assert "Traceback" not in proc.stderr
        # the steps' stderr (the libraries' bars and warnings) went to a log each, not the report
        logs = {p.name: p.read_text() for p in (part.results_dir / "logs").glob("*.log")}
        assert [name for name, text in logs.items() if "Traceback" in text] == []
        assert "it/s]" not in proc.stdout and "it/s]" not in proc.stderr
        bars += [name for name, text in logs.items() if "it/s]" in text]
        assert_fits(proc.stdout)                 # every report of every step: 65 columns
        run = part.saved("lab_run")
        assert run["completed"] is True and run["quick"] is True
    assert bars, "no step's log holds a progress bar: were they printed in the reports?"
    ran = [s for part in whole_lab for s in part.saved("lab_run")["steps"]]
    assert [s["script"] for s in ran] == [step.script for step in steps.STEPS]
    for step in ran:
        assert step["exit_code"] == 0 and step["seconds"] > 0, step


def test_quick_gives_each_step_its_small_workload(whole_lab):
    """Each step ran with its arguments and --quick's (common/steps.py); each step's own test of
    the lab's run checks what its small workload made."""
    by_name = steps.by_name()
    for part in whole_lab:
        args = {s["script"]: s["args"] for s in part.saved("lab_run")["steps"]}
        assert args == {script: by_name[Path(script).stem].command(part.port, quick=True)[1:]
                        for script in args}


def test_every_step_stays_in_the_memory_budget(whole_lab):
    ran = [s for part in whole_lab for s in part.saved("lab_run")["steps"]]
    for step in ran:
        assert 0 < step["peak_memory_bytes"] < printed.MEMORY_BUDGET_BYTES, step
    # the steps that talk to the lab's server (tasks 5-8): the script + the server's 3
    # processes: the API server, its engine core holding the worker
    # (VLLM_ENABLE_V1_MULTIPROCESSING=0) and multiprocessing's resource tracker
    shared = [step.script for step in steps.STEPS if steps.PORT in step.args
              and not step.own_engines]
    assert shared and {s["script"]: s["peak_processes"] for s in ran
                       if s["script"] in shared} == {script: 4 for script in shared}


def test_the_server_is_stopped_before_the_steps_with_engines_of_their_own(whole_lab):
    """The lab stops the server the steps before shared ahead of the first step that runs
    engines of its own (task 9), so its memory is not charged to that step; a later one that
    starts the lab's server itself stops it after, so no other finds one left to stop."""
    own = [step.script for step in steps.STEPS if step.own_engines]
    stopped = [script for part in whole_lab for script in own
               if f"Stopped the lab's vLLM server on :{part.port}: {script} runs engines of its "
                  f"own." in part.out]
    assert stopped == own[:1]
    # the closing note says so where it happened, and nowhere that a server is left running
    first = steps.by_name()[Path(own[0]).stem].label
    assert [f"The lab's vLLM server was stopped before {first};" in part.out
            for part in whole_lab] == [True, False]
    assert not any("is still running on" in part.out for part in whole_lab)


def test_the_summary_has_every_row_and_the_roofline(whole_lab, monkeypatch):
    """Each part's summary has a row for every step, in the list's order: its own steps' from
    the results it saved, the other part's not run yet; the roofline where tasks 1, 2 and 6
    ran."""
    for part in whole_lab:
        s = part.saved("summary")
        assert [(r["step"], r["what"]) for r in s["rows"]] == [(step.number, step.title)
                                                               for step in steps.STEPS]
        ran = {Path(r["script"]).stem for r in part.saved("lab_run")["steps"]}
        monkeypatch.setenv("LAB_RESULTS_DIR", str(part.results_dir))
        for row, step in zip(s["rows"], steps.STEPS):
            if step.name in ran:   # each step's own figure: in its own test of the lab's run
                assert row["figure"] == step.row(step.load()), step.name
            else:
                assert "not run yet" in row["figure"], step.name
        assert s["lab_run"]["steps"] == part.saved("lab_run")["steps"]
        assert "Last lab.py --quick (min):" in part.proc.stdout
        assert "(--quick: small workloads)" in part.out
    # the roofline: in the part that ran tasks 1, 2 and 6, each measured step on three rungs,
    # the kernel floor measured at the batches that ran
    (first,) = [part for part in whole_lab if "task_1_hf_baseline.py" in
                [s["script"] for s in part.saved("lab_run")["steps"]]]
    roofline = first.saved("summary")["roofline"]
    assert set(roofline["placed"]) == {"task_1_hf_baseline", "task_2_vllm_inference",
                                       "task_6_multi_user_load"}
    assert roofline["num_params"] == 134_515_008
    # one machine file for the whole run: the floor covers every batch a step asked for (task
    # 9's cap too), and so the summary's 1 request and task 6's 20 users
    assert {"1", "20"} <= set(first.saved("machine")["kernel_floor"]["step_s"])
    rungs = roofline["rungs"]
    assert [g["label"] for g in rungs] == ["HF, 1 request", "vLLM, 1 request",
                                           "server, 1 user", "server, 20 users"]
    assert all(g["floor_ms"] > 0 and g["step_ms"] > 0 for g in rungs)


def test_each_report_is_saved_for_the_report_page(whole_lab):
    """Each step's report as the terminal showed it, in results/<script>.txt, and the page
    drawn from them, results/report.html."""
    for part in whole_lab:
        for step in part.saved("lab_run")["steps"]:
            text = (part.results_dir / f"{Path(step['script']).stem}.txt").read_text()
            assert text.strip() and text in part.proc.stdout, step["script"]
        # the summary runs after the steps as they do, its report saved as theirs are
        text = (part.results_dir / "summary.txt").read_text()
        assert text.strip() and text in part.proc.stdout
        assert (part.results_dir / "report.html").stat().st_size > 0


def test_every_report_fits_two_screens_and_its_insight_twelve_lines(whole_lab):
    """A report a learner reads to the end: at most report.MAX_LINES lines, the summary's
    included; its KEY INSIGHT at most MAX_INSIGHT_BULLETS bullets in MAX_INSIGHT_LINES lines;
    and a step that left detail out of the terminal kept it for the report page."""
    for part in whole_lab:
        for name in [Path(s["script"]).stem for s in part.saved("lab_run")["steps"]] + ["summary"]:
            text = (part.results_dir / f"{name}.txt").read_text()
            assert len(text.splitlines()) <= report.MAX_LINES, (name, len(text.splitlines()))
            for block in text.split("KEY INSIGHT:\n")[1:]:
                lines = block.split("\n=")[0].splitlines()
                bullets = [line for line in lines if line.startswith("- ")]
                assert 1 <= len(bullets) <= report.MAX_INSIGHT_BULLETS, (name, block)
                assert len(lines) <= report.MAX_INSIGHT_LINES, (name, block)
            if "--detail" in text:
                assert (part.results_dir / f"{name}.detail.txt").read_text().strip(), name


def test_the_lab_leaves_no_process_on_its_ports(whole_lab):
    """Nothing of the lab runs on its ports once it is done: the lab stopped the server the steps
    before task 9 shared, and each later step stopped the one it started."""
    for part in whole_lab:
        assert processes_on_port(part.port) == [], part.port
