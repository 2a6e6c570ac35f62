"""The shared figures and the report page: the roofline's curve and points by hand, every
step's figures drawn from small saved results with a title, labelled axes and a caption, the
report page leading with the section-10 table (the source's figures beside this run's), then
the figures, then every report folded; and the page in a real headless Chromium: every image
loaded, no console error, the reports folded until clicked. It goes over common/steps.py: the
results it draws from are every step's hand-built record (tests/hand/: a step declares its own
there), and what it expects of each step (its figures, its row) it reads from the list and from
those records. (Each task's own figures are tested with its task: tests/tasks/test_tasks_3_4.py,
test_tasks_6_7.py, test_task_<N>.py.)"""
from __future__ import annotations

import base64
import html
import re
import shutil

import pytest

import lab
import task_3_kv_cache_problem as task3
import task_4_paged_attention as task4
from common import figures, html_report, results, settings, steps
from lessons.summary import figure as roofline_figure
from lessons.summary import roofline as rl
from tests import hand
from tests.helpers import chromium, save_hand_results


# --- the roofline ---------------------------------------------------------------------------------
def placement(**given) -> rl.Placement:
    return hand.fill(rl.Placement, **given)


def test_roofline_curve_by_hand():
    # 1 GB of weights read once per step at 10 GB/s, 1 MB of KV per request: batch 1 reads
    # 1.001 GB: 10 / 1.001 = 9.99 tok/s; batch 10 reads 1.01 GB for 10 tokens: 99.0 tok/s.
    # 2 GFLOP per token at 100 GFLOP/s: the compute roof is 50 tok/s, whatever the batch.
    r = placement(bandwidth_gb_s=10.0, weight_bytes=10**9, bytes_per_token=10**9 + 10**6,
                  flops_per_token=2 * 10**9, matmul_gflop_s={"float32": 100.0}, dtype="float32")
    read, compute, roof = roofline_figure.roofline_curve(r, [1, 10])
    assert read == pytest.approx([10 / 1.001, 100 / 1.01])
    assert compute == [50.0, 50.0] and roof == 50.0


HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32")


def test_roofline_points_label_every_measured_step():
    res = save_hand_results()
    s = res["summary"]
    points = roofline_figure.roofline_points(s.roofline, s.engine_point)
    cont = res["task_9_build_your_own_engine"].policies["continuous"]
    assert [(label, batch, kind) for label, batch, _, kind in points] == [
        ("kernel floor, batch 1", 1, "floor"), ("kernel floor, batch 20", 20, "floor"),
        ("HF, 1 request", 1, "measured"), ("vLLM, 1 request", 1, "measured"),
        ("server, 1 user", 1, "measured"), ("server, 20 users", 20, "measured"),
        # task 9, continuous: its tokens over its steps, the mean batch of a step
        ("own engine (task 9), continuous", cont.num_tokens / cont.num_steps, "engine")]
    six = res["task_6_multi_user_load"].levels
    # tokens/s: the floor's batch / its seconds; the rest as measured
    assert [tps for _, _, tps, _ in points] == pytest.approx(
        [1 / 0.070, 20 / 0.180, 15.0, 16.0, six[0].tokens_per_s, six[-1].tokens_per_s,
         cont.tokens_per_s], rel=1e-3)


# --- every figure, from the saved results ---------------------------------------------------------
def test_the_report_page_follows_the_steps_list():
    names = [part.name for part in html_report.sections()]
    assert names == [c[0].removesuffix(".py") for c in lab.steps(8000)] + ["summary"]
    # a section with figures for every step that declares some, and for the summary (its
    # roofline), with their suffixes in the package's order (each step's own: its test file)
    assert {p.name: [suffix for suffix, _ in p.figures]
            for p in html_report.sections() if p.figures} == {
        step.name: [suffix for suffix, _ in step.figures]
        for step in [*steps.STEPS, steps.SUMMARY] if step.figures}
    assert [suffix for suffix, _ in steps.SUMMARY.figures] == [""]


def test_every_figure_has_a_title_axes_with_units_and_a_caption():
    """(Tasks 3-4's figures: tests/tasks/test_tasks_3_4.py, from their own saved results.)"""
    res = save_hand_results()
    drawn = []
    for part in html_report.sections():
        if part.name not in res:
            continue   # a step without a saved result here
        r = res[part.name]
        for suffix, draw in part.figures:
            fig = draw(r)
            hand.assert_figure_reads_well(fig, r, (part.name, suffix))
            figures.plt().close(fig)
            drawn.append((part.name, suffix))
    # every figure of every step with a hand-built record, and the summary's roofline
    by_name = steps.by_name()
    assert drawn == [(name, suffix) for name in [*hand.modules(), "summary"]
                     for suffix, _ in (by_name.get(name) or steps.SUMMARY).figures]


def test_an_axes_without_labels_fails_the_label_check():
    """The check above can fail: an axes with a line and no label is caught."""
    record = hand.fill(results.Result, header=HEADER, measured_at="2026-12-01T08:00")
    record.measured_on = results.Machine(settings.cpu_model_name(), 2)
    fig, ax = figures.figure(2.0)
    ax.plot([0, 1], [0, 1])
    figures.finish(fig, "a title", record)
    with pytest.raises(AssertionError, match="no x or y label"):
        hand.assert_figure_reads_well(fig, record)
    ax.set_xlabel("x (tokens)")
    hand.assert_figure_reads_well(fig, record)
    figures.plt().close(fig)


# --- the report page --------------------------------------------------------------------------------
def figures_of(res: dict[str, results.Result]) -> int:
    """The figures the report page shows for these saved results: every figure of every section
    (a step, or the summary) that has one."""
    return sum(len(part.figures) for part in html_report.sections() if part.name in res)


def test_report_page_leads_with_the_table_then_figures_then_folded_reports(model_args, capsys):
    task3.main(model_args)
    (settings.results_dir() / "task_3_kv_cache_problem.txt").write_text(
        capsys.readouterr().out)
    save_hand_results()
    page = html_report.write().read_text()
    table, figs, reports = (page.index('<h2 id="table">'), page.index('<h2 id="figures">'),
                            page.index('<h2 id="reports">'))
    assert table < figs < reports
    # the source's own figure beside this run's, for every step where the source has one
    sources = [step.source for step in steps.STEPS if step.source]
    assert sources
    for source in sources:
        assert f'<td class="source">{html.escape(source)}</td>' in page[table:figs], source
    # this run's: each hand-built record's row as its module declares it (task 1: 15.0 tok/s),
    # and how to run each step without a saved result (task 5: not run yet)
    for name, module in hand.modules().items():
        assert f"<td>{html.escape(module.SUMMARY_ROW)}</td>" in page[table:figs], name
    loaded, _ = steps.load_all(html_report.sections())
    not_run = [step for step in steps.STEPS if step.name not in loaded]
    assert not_run
    for step in not_run:
        assert f"<td>not run yet: python {step.script}</td>" in page[table:figs], step.name
    # every image is a figure, above the reports, one for each figure of every section with a
    # saved result (task 3's, the hand-built records', the summary's); every report folded,
    # one per section
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == figures_of(loaded) > 1
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert page.rindex("<img ") < reports
    folded = re.findall(r'<details id="([a-z0-9_]+)"><summary>', page)
    assert folded == [part.name for part in html_report.sections()]
    assert "<details open" not in page
    # a step with no saved result says so, with the command; one with a report shows it
    for step in not_run:
        assert f"not run yet: {step.label}" in page[reports:], step.name
    assert ('<details id="task_3_kv_cache_problem"><summary>Task 3: The KV Cache Problem - Why '
            'Memory Matters</summary>') in page
    assert "Memory utilization:" in page[reports:]
    assert "No report text saved" in page                  # task 6: a result without its text
    assert "src=\"http" not in page and "href=\"http" not in page   # opens offline
    # the glossary of the reports' terms, linked where the page lies
    (href,) = re.findall(r'<a href="([^"]+)">docs/glossary.md</a>', page)
    assert (settings.results_dir() / href).resolve() == settings.REPO_DIR / "docs/glossary.md"


def test_report_page_in_a_real_browser(model_args, tmp_path, capsys):
    """The page as an instructor opens it: the table first, every image loaded, no console
    error, every step's report folded until its title is clicked. Saves a screenshot in the
    test's folder."""
    from selenium.webdriver.common.by import By

    task3.main(model_args)
    (settings.results_dir() / "task_3_kv_cache_problem.txt").write_text(
        capsys.readouterr().out)
    task4.main(model_args)
    save_hand_results()
    capsys.readouterr()
    page = html_report.write()
    driver, profile = chromium()
    try:
        driver.set_window_size(1000, 1300)
        driver.get(page.as_uri())
        images = driver.find_elements(By.TAG_NAME, "img")
        assert len(images) == figures_of(steps.load_all(html_report.sections())[0])  # 4's too
        widths = [driver.execute_script("return arguments[0].complete && "
                                        "arguments[0].naturalWidth", img) for img in images]
        assert all(w and w > 0 for w in widths), widths
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
        # what the first screen shows: the title, the run, the section-10 table
        table = driver.find_element(By.CSS_SELECTOR, "table.steps")
        assert table.location["y"] < 1300 and "10.5 tok/s" in table.text
        shot = tmp_path / "report.png"   # pytest keeps the last 3 runs' under its basetemp
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
        details = driver.find_elements(By.TAG_NAME, "details")
        assert [d.get_attribute("id") for d in details] == [
            part.name for part in html_report.sections()]
        three = driver.find_element(By.ID, "task_3_kv_cache_problem")
        pre = three.find_element(By.TAG_NAME, "pre")
        assert not pre.is_displayed()                                   # folded
        three.find_element(By.TAG_NAME, "summary").click()
        assert pre.is_displayed() and "Memory utilization:" in pre.text  # one click opens it
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
