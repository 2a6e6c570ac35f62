"""The shared figures and the report page: the roofline's curve and points by hand, every
step's figures drawn from small saved results with a title, labelled axes and a caption, the
report page leading with the section-10 table (the source's figures beside this run's), then
the figures, then every report folded; and the page in a real headless Chromium: every image
loaded, no console error, the reports folded until clicked. (Each task's own figures are
tested with its task: tests/test_kv_tasks.py, test_tasks_6_7.py, test_task_9.py,
test_task_10.py.)"""
from __future__ import annotations

import base64
import re
import shutil

import pytest

import lab
import summary
import task_1_hf_baseline as task1
import task_2_vllm_inference as task2
import task_3_kv_cache_problem as task3
import task_4_paged_attention as task4
from common import figures, html_report, results, settings, steps
from common import roofline as rl
from tests import hand_results as hand
from tests import test_task_9 as task_9_tests
from tests import test_task_10 as task_10_tests
from tests import test_task_11 as task_11_tests
from tests import test_task_12 as task_12_tests
from tests import test_tasks_6_7 as tasks_6_7


# --- the roofline ---------------------------------------------------------------------------------
def placement(**given) -> rl.Placement:
    return hand.fill(rl.Placement, **given)


def test_roofline_curve_by_hand():
    # 1 GB of weights read once per step at 10 GB/s, 1 MB of KV per request: batch 1 reads
    # 1.001 GB: 10 / 1.001 = 9.99 tok/s; batch 10 reads 1.01 GB for 10 tokens: 99.0 tok/s.
    # 2 GFLOP per token at 100 GFLOP/s: the compute roof is 50 tok/s, whatever the batch.
    r = placement(bandwidth_gb_s=10.0, weight_bytes=10**9, bytes_per_token=10**9 + 10**6,
                  flops_per_token=2 * 10**9, matmul_gflop_s={"float32": 100.0}, dtype="float32")
    read, compute, roof = rl.roofline_curve(r, [1, 10])
    assert read == pytest.approx([10 / 1.001, 100 / 1.01])
    assert compute == [50.0, 50.0] and roof == 50.0


SMOL = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
        "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152,
        "tie_word_embeddings": True}
HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="float32")


def save_hand_results() -> dict[str, results.Result]:
    """Small results, typed in as the scripts save them, for tasks 1, 2, 6, 7, 9-12 and the
    summary (its roofline placed by roofline.place from them); returns them as loaded back."""
    hand.save("task_1_hf_baseline", task1.HFBaseline, HEADER, tokens_per_s=15.0,
              total_time_s=50 / 15, generated_tokens=50)
    hand.save("task_2_vllm_inference", task2.VLLMInference, HEADER, tokens_per_s=16.0)
    tasks_6_7.save_hand_results()   # tasks 6 and 7: 1, 5, 10, 20 users; configs A, B, C
    nine = task_9_tests.hand_result()
    results.save("task_9_build_your_own_engine", nine)
    results.save("task_10_prefix_caching", task_10_tests.hand_result())
    results.save("task_11_chunked_prefill", task_11_tests.hand_result())
    results.save("task_12_speculative_decoding", task_12_tests.hand_result())
    res, _ = steps.load_all()
    cost = rl.model_cost(SMOL, "float32", 4)
    machine = rl.Machine(20e9, {"float32": 100e9, "bfloat16": 0.3e9}, threads=2)
    floor = rl.KernelFloor("float32", 2, cost.matmul_params, {1: 0.070, 20: 0.180})
    record = summary.Summary(header=HEADER,
                             roofline=rl.place(summary.measured_steps(res), cost, machine, 70,
                                               floor),
                             engine_point=summary.engine_point(res, "float32"))
    results.save("summary", record)
    loaded, stale = html_report.load(html_report.sections())
    assert stale == {}
    return loaded


def test_roofline_points_label_every_measured_step():
    res = save_hand_results()
    s = res["summary"]
    points = rl.roofline_points(s.roofline, s.engine_point)
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
    # the figures issues 19, 23 and 24 ask for: tasks 3, 4, 6, 7, 9 (two), 10, 11, 12 and the
    # roofline
    assert {p.name: [suffix for suffix, _ in p.entries]
            for p in html_report.sections() if p.entries} == {
        "task_3_kv_cache_problem": [""], "task_4_paged_attention": [""],
        "task_6_multi_user_load": [""], "task_7_tuning": [""],
        "task_9_build_your_own_engine": ["", "phases"], "task_10_prefix_caching": [""],
        "task_11_chunked_prefill": [""], "task_12_speculative_decoding": [""],
        "summary": [""]}


@pytest.fixture(scope="module")
def model_args(tiny_model):
    return ["--model", tiny_model, "--dtype", "float32"]


def test_every_figure_has_a_title_axes_with_units_and_a_caption():
    """(Tasks 3-4's figures: tests/test_kv_tasks.py, from their own saved results.)"""
    res = save_hand_results()
    drawn = 0
    for part in html_report.sections():
        if part.name not in res:
            continue   # a step without a saved result here
        r = res[part.name]
        for suffix, draw in part.entries:
            fig = draw(r)
            hand.assert_figure_reads_well(fig, r, (part.name, suffix))
            figures.plt().close(fig)
            drawn += 1
    assert drawn == 8   # tasks 6, 7, 9 (two), 10, 11, 12 and the summary's roofline


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
    for source in ("10.5 tok/s", "11.9 tok/s (1.1x)", "utilisation 20.3%",
                   "utilisation 95.4%, users 4.8x", "/v1/completions, 3.83 s",
                   "20 users 163.4 tok/s (12.6x)", "A 95.2 / B 101.9 / C 53.6 tok/s"):
        assert f'<td class="source">{source}</td>' in page[table:figs], source
    assert "<td>15.0 tok/s</td>" in page[table:figs]                      # task 1, this run
    assert "<td>not run yet: python task_5_api_server.py</td>" in page[table:figs]
    # every image is a figure, above the reports; every report folded, one per section
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 9                     # tasks 3, 6, 7, 9 (2), 10, 11, 12, summary
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert page.rindex("<img ") < reports
    folded = re.findall(r'<details id="([a-z0-9_]+)"><summary>', page)
    assert folded == [part.name for part in html_report.sections()]
    assert "<details open" not in page
    # a step with no saved result says so, with the command; one with a report shows it
    assert "not run yet: task 5" in page[reports:]
    assert ('<details id="task_3_kv_cache_problem"><summary>Task 3: The KV Cache Problem - Why '
            'Memory Matters</summary>') in page
    assert "Memory utilization:" in page[reports:]
    assert "No report text saved" in page                  # task 6: a result without its text
    assert "src=\"http" not in page and "href=\"http" not in page   # opens offline


def test_report_page_in_a_real_browser(model_args, tmp_path, capsys):
    """The page as an instructor opens it: the table first, every image loaded, no console
    error, every step's report folded until its title is clicked. Saves a screenshot in the
    test's folder."""
    from selenium.webdriver.common.by import By

    from tests.test_dashboard import chromium

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
        assert len(images) == 10                      # task 4's too
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
