"""The figures and the report page: what each figure plots, checked on workloads worked out by
hand (the matrix, never the pixels); every registered figure drawn from small saved results with
its title, axes and caption; the report page in a real headless Chromium: every image loaded, no
console error, every step's section there."""
from __future__ import annotations

import base64
import dataclasses
import re
import shutil
from pathlib import Path

import pytest

import lab
import task_3_kv_cache_problem as task3
import task_4_paged_attention as task4
from common import figures, html_report, kv, results, settings, steps
from common import roofline as rl

# --- task 9: the batching timeline ---------------------------------------------------------------
# tests/test_engine.py's workload: outputs of 8, 1, 1, 1 tokens in arrival order, batch cap 2,
# one token per live request per step. By hand:
# - static: [0, 1] for 8 steps (1 is done after step 0 and stays as padding for steps 1-7), then
#   [2, 3] at step 8: 9 steps;
# - static no-pad: the same, but 1's row leaves the compute after step 0 and no one takes its
#   slot before the batch ends: slot 1 idle for steps 1-7;
# - continuous: 2 takes 1's slot at step 1, 3 takes 2's at step 2, then 0 runs alone: 8 steps.
HAND = {"static": {"seq_ids": ["0 1"] * 8 + ["2 3"], "padding_ids": [""] + ["1"] * 7 + [""]},
        "static no-pad": {"seq_ids": ["0 1"] + ["0"] * 7 + ["2 3"], "padding_ids": [""] * 9},
        "continuous": {"seq_ids": ["0 1", "0 2", "0 3"] + ["0"] * 5, "padding_ids": [""] * 8}}
_ = None   # an idle slot
EXPECTED = {   # ids[slot][step]; padding cells (slot, steps)
    "static": ([[0] * 8 + [2], [1] * 8 + [3]], {(1, s) for s in range(1, 8)}),
    "static no-pad": ([[0] * 8 + [2], [1] + [_] * 7 + [3]], set()),
    "continuous": ([[0] * 8, [1, 2, 3] + [_] * 5], set()),
}


def grid_of(record: dict, max_batch: int = 2) -> figures.Timeline:
    return figures.timeline_grid(figures._ids(record["seq_ids"]),
                                 figures._ids(record["padding_ids"]), max_batch)


@pytest.mark.parametrize("label", list(HAND))
def test_timeline_grid_of_the_hand_workload(label):
    grid = grid_of(HAND[label])
    ids, padding = EXPECTED[label]
    assert grid.ids == ids
    assert {(slot, step) for slot, row in enumerate(grid.is_padding)
            for step, flag in enumerate(row) if flag} == padding
    assert grid.num_steps == {"static": 9, "static no-pad": 9, "continuous": 8}[label]
    # each request's live cells are exactly the tokens it made: 8, 1, 1, 1
    live = [seq for row, flags in zip(grid.ids, grid.is_padding)
            for seq, padded in zip(row, flags) if seq is not None and not padded]
    assert [live.count(i) for i in range(4)] == [8, 1, 1, 1]


def test_a_request_keeps_its_slot_and_a_newcomer_takes_the_lowest_free():
    # step 0: 0 in slot 0, 1 in slot 1; step 1: 0 has left, 1 stays in slot 1 (not moved to 0);
    # step 2: 2 arrives and takes slot 0, the lowest free, not slot 2
    grid = figures.timeline_grid([[0, 1], [1], [1, 2]], [[], [], []], max_batch=3)
    assert grid.ids == [[0, _, 2], [1, 1, 1], [_, _, _]]
    # a preempted request that comes back is a newcomer: lowest free slot again
    grid = figures.timeline_grid([[0, 1], [0], [0, 1]], [[], [], []], max_batch=2)
    assert grid.ids == [[0, 0, 0], [1, _, 1]]
    with pytest.raises(ValueError, match="more than the 1 slots"):
        figures.timeline_grid([[0, 1]], [[]], max_batch=1)


@pytest.mark.parametrize("policy, pad, label", [("static", True, "static"),
                                                ("static", False, "static no-pad"),
                                                ("continuous", True, "continuous")])
def test_the_engine_records_the_hand_timeline(tiny_model, policy, pad, label):
    """The engine's own step records (StepStats.seq_ids / padding_ids), saved as task 9 saves
    them, are the hand workload's above, row for row."""
    from transformers import AutoTokenizer

    from mini_engine import LLMEngine, Llama
    from mini_engine.engine import eos_token_ids

    eng = LLMEngine(Llama(tiny_model), eos_token_ids(tiny_model), settings.KV_CACHE_BYTES,
                    page_size=16, max_batch=2, policy=policy, pad_finished=pad)
    prompt = AutoTokenizer.from_pretrained(tiny_model)("Hello there")["input_ids"]
    for n in (8, 1, 1, 1):
        eng.add_request(prompt, n, min_tokens=n)
    eng.run()
    assert figures.timeline_record(eng.steps) == HAND[label]


def test_runs_of_a_slot_row():
    assert figures.runs_of([0, 0, _, 2, 2, 2], [False, True, False, False, False, False]) == [
        (0, 1, 0, False), (1, 1, 0, True), (2, 1, None, False), (3, 3, 2, False)]


# --- task 4: the page pool ----------------------------------------------------------------------
def test_pool_owners_of_the_source_requests():
    """Task 4's five requests in a 32-page pool (tests/test_kv_tasks.py works them out): the
    first pages go out one per request in turn (R1 page 0, R2 1, R3 2, R4 3, R5 4); Quick
    greeting (R3) holds pages 2 and 7 and frees them at step 23; Long document (R4) gets them
    again as its 15th and 16th pages (logical 14 and 15). 34 holdings of 32 pages."""
    names = ["a", "b", "c", "d", "e"]
    run = kv.run_paged([45, 128, 23, 256, 67], names, page_size=16, num_pool_pages=32)
    requests = [{"page_ids": s.page_table, "finish_step": step}
                for s, step in zip(run.sequences, run.finish_steps)]
    owners = figures.pool_owners(requests, 32)
    assert [o[0] for o in owners[:5]] == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0)]
    assert owners[2] == [(2, 0), (3, 14)] and owners[7] == [(2, 1), (3, 15)]
    assert all(len(o) == 1 for page, o in enumerate(owners) if page not in (2, 7))
    assert sum(map(len, owners)) == 34


# --- the roofline ---------------------------------------------------------------------------------
def test_roofline_curve_by_hand():
    # 1 GB of weights read once per step at 10 GB/s, 1 MB of KV per request: batch 1 reads
    # 1.001 GB: 10 / 1.001 = 9.99 tok/s; batch 10 reads 1.01 GB for 10 tokens: 99.0 tok/s.
    # 2 GFLOP per token at 100 GFLOP/s: the compute roof is 50 tok/s, whatever the batch.
    r = {"bandwidth_gb_s": 10.0, "weight_bytes": 1e9, "bytes_per_token": 1e9 + 1e6,
         "flops_per_token": 2e9, "matmul_gflop_s": {"float32": 100.0}, "dtype": "float32"}
    read, compute, roof = figures.roofline_curve(r, [1, 10])
    assert read == pytest.approx([10 / 1.001, 100 / 1.01])
    assert compute == [50.0, 50.0] and roof == 50.0


SMOL = {"hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
        "num_hidden_layers": 30, "intermediate_size": 1536, "vocab_size": 49152,
        "tie_word_embeddings": True}
COMMON = {"model": "SmolLM2-135M-Instruct", "dtype": "float32"}


def save_hand_results() -> dict[str, dict]:
    """Small results, typed in (the shapes the scripts save), for tasks 6, 7, 9 and the summary
    (its roofline placed by roofline.place from them); returns them as loaded back."""
    results.save("task_1_hf_baseline", COMMON | {"tokens_per_s": 15.0, "total_time_s": 50 / 15,
                                                 "generated_tokens": 50})
    results.save("task_2_vllm_inference", COMMON | {"tokens_per_s": 16.0})
    levels = [{"users": u, "total_tokens": 50 * u, "duration_s": d,
               "throughput_tok_s": round(50 * u / d, 2), "p50_latency_s": d * 0.9,
               "p95_latency_s": d, "mean_latency_s": d * 0.9, "mean_ttft_s": 0.1 * u,
               "mean_tpot_s": d / 50, "succeeded": u, "failed": 0}
              for u, d in ((1, 3.8), (5, 7.0), (10, 9.0), (20, 12.5))]
    results.save("task_6_multi_user_load", COMMON | {
        "levels": levels, "scaling_factor": 4.2,
        "sequential": {"users": 20, "duration_s": 76.0, "succeeded": 20, "failed": 0}})
    results.save("task_7_tuning", COMMON | {"settings": {"requests": 10}, "configs": [
        {"label": label, "max_model_len": length, "max_num_seqs": seqs, "throughput_tok_s": tps,
         "mean_latency_s": lat, "p50_latency_s": lat, "p95_latency_s": lat * 1.1,
         "peak_running": running, "peak_waiting": waiting}
        for label, length, seqs, tps, lat, running, waiting in (
            ("A: Default", 128, 256, 72.0, 6.9, 10, 0),
            ("B: Shorter Context", 64, 256, 74.0, 6.7, 10, 0),
            ("C: Limited Concurrency", 64, 8, 60.0, 8.3, 8, 2))]})
    results.save("task_9_build_your_own_engine", COMMON | {
        "settings": {"max_batch": 2}, "workload_output_lengths": [8, 1, 1, 1],
        "correctness": {"num_identical": 8, "num_prompts": 8},
        "timelines": HAND,
        # slot utilisation = 11 tokens / (2 slots x steps)
        "policies": {"static": {"num_tokens": 11, "num_steps": 9, "tokens_per_s": 40.0,
                                "slot_utilization": 11 / 18},
                     "continuous": {"num_tokens": 11, "num_steps": 8, "tokens_per_s": 50.0,
                                    "slot_utilization": 11 / 16}},
        "phases": {b: {"matmul": m, "attention": 0.002, "forward_other": 0.003,
                       "sampling": 0.001, "scheduling": 0.0005, "step": m + 0.0065}
                   for b, m in (("1", 0.070), ("2", 0.080))},
        "machine": {"kernel_floor_s": {"1": 0.065, "2": 0.072}, "weight_read_s": 0.027,
                    "weight_bytes": 538_000_000, "bandwidth_bytes_s": 20e9}})
    # task 10: two requests sharing pages 0 and 1 at the peak, each with one page of its own:
    # 4 pages held where unshared tables would hold 3 + 3 = 6
    peak = {"step": 3, "pages_held": 4, "pages_unshared": 6, "running": 2,
            "tables": {"0": [0, 1, 2], "1": [0, 1, 3]},
            "ref_counts": {"0": 2, "1": 2, "2": 1, "3": 1}}
    results.save("task_10_prefix_caching", COMMON | {
        "hit_rate": 32 / 70, "ttft_off_s": 0.5, "ttft_on_s": 0.3,
        "mini_engine": [{"peak_pages": 6, "peak": None}, {"peak_pages": 4, "peak": peak}]})
    res = figures.load_results()
    cost = rl.model_cost(SMOL, "float32", 4)
    machine = rl.Machine(20e9, {"float32": 100e9, "bfloat16": 0.3e9}, threads=2)
    floor = rl.KernelFloor("float32", 2, cost.matmul_params, {1: 0.070, 20: 0.180})
    typed = {name: results.record_of(name).from_dict(r) for name, r in res.items()}
    results.save("summary", COMMON | {"roofline": rl.place(typed, cost, machine, 70, floor)})
    return figures.load_results()


def test_roofline_points_label_every_measured_step():
    res = save_hand_results()
    points = figures.roofline_points(res)
    assert [(label, batch, kind) for label, batch, _, kind in points] == [
        ("kernel floor, batch 1", 1, "floor"), ("kernel floor, batch 20", 20, "floor"),
        ("HF, 1 request", 1, "measured"), ("vLLM, 1 request", 1, "measured"),
        ("server, 1 user", 1, "measured"), ("server, 20 users", 20, "measured"),
        # task 9, continuous: 11 tokens in 8 steps, 1.375 per step on average
        ("own engine (task 9), continuous", 1.375, "engine")]
    # tokens/s: the floor's batch / its seconds; the rest as measured
    assert [tps for _, _, tps, _ in points] == pytest.approx(
        [1 / 0.070, 20 / 0.180, 15.0, 16.0, 50 / 3.8, 1000 / 12.5, 50.0], rel=1e-3)


# --- every registered figure, from the saved results ----------------------------------------------
def test_the_report_page_and_the_figures_follow_the_steps_list():
    assert html_report.step_names() == [Path(c[0]).stem for c in lab.steps(8000)] + ["summary"]
    # the figures issue 19 asks for: tasks 3, 4, 6, 7, 9 (two), 10 and the summary's roofline
    assert {step.name: [suffix for suffix, _ in step.figures]
            for step in [*steps.STEPS, steps.SUMMARY] if step.figures} == {
        "task_3_kv_cache_problem": [""], "task_4_paged_attention": [""],
        "task_6_multi_user_load": [""], "task_7_tuning": [""],
        "task_9_build_your_own_engine": ["", "phases"], "task_10_prefix_caching": [""],
        "summary": [""]}


@pytest.fixture(scope="module")
def model_args(tiny_model):
    return ["--model", tiny_model, "--dtype", "float32"]


def test_every_figure_has_a_title_axes_with_units_and_a_caption(model_args):
    task3.main(model_args)
    task4.main(model_args)
    res = save_hand_results()
    drawn = 0
    registry = {name: steps.figures_of(name) for name in steps.report_names()}
    for name, entries in registry.items():
        if name not in res:
            continue   # a step without a figure
        for suffix, draw in entries:
            fig = draw(res)
            assert fig is not None, (name, suffix)
            assert fig.get_suptitle(), (name, suffix)
            caption = fig.get_supxlabel()
            r = res[name]
            assert r["dtype"] in caption and "cores" in caption, caption
            assert r["measured_at"][:10] in caption and settings.cpu_model_name() in caption
            for ax in fig.axes:
                if ax.axison and ax.has_data():
                    assert ax.get_xlabel() or ax.get_ylabel() or ax.get_xticklabels(), \
                        (name, suffix, ax.get_title())
            figures._plt().close(fig)
            drawn += 1
    assert drawn == sum(len(e) for n, e in registry.items() if n in res) == 8


def test_what_the_load_and_tuning_figures_plot():
    res = save_hand_results()
    fig = figures.load_levels(res)
    tps, lat, seq = fig.axes
    assert list(tps.lines[0].get_xdata()) == [1, 5, 10, 20]
    assert list(tps.lines[0].get_ydata()) == [13.16, 35.71, 55.56, 80.0]   # 50 x users / s
    assert [line.get_label() for line in lat.lines] == ["p50 latency", "p95 latency",
                                                        "mean time to first token"]
    assert list(lat.lines[1].get_ydata()) == [3.8, 7.0, 9.0, 12.5]          # p95
    assert [b.get_height() for b in seq.patches] == [76.0, 12.5]           # one by one, together
    fig = figures.tuning(res)
    tps, lat, peak = fig.axes
    assert [b.get_height() for b in tps.patches] == [72.0, 74.0, 60.0]
    assert [b.get_height() for b in peak.patches] == [10, 10, 8, 0, 0, 2]   # running, waiting


def test_a_script_draws_its_figure_and_says_so(model_args, capsys):
    task3.main(model_args)
    out = capsys.readouterr().out
    png = figures.png_path("task_3_kv_cache_problem")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the report's last lines (a long path wraps onto lines of its own)
    squashed = re.sub(r"\s+", "", out)
    assert squashed.endswith(f"Saved:{figures.png_path('task_3_kv_cache_problem').with_suffix('.json')}"
                             f"Figure:{png}")


def test_a_figure_that_fails_is_one_line_not_a_crash(model_args, capsys, monkeypatch):
    def broken(res):
        raise KeyError("requests")
    step = steps.by_name()["task_3_kv_cache_problem"]
    monkeypatch.setattr(steps, "by_name", lambda: {step.name: dataclasses.replace(
        step, figures=(("", broken),))})
    r = task3.main(model_args)
    assert r["utilization_pct"] == 20.3                    # the task ran and saved its result
    out = " ".join(capsys.readouterr().out.split())     # the line wraps at 65 columns
    assert out.endswith("Figure task_3_kv_cache_problem.png not drawn: KeyError: 'requests'")


# --- the report page --------------------------------------------------------------------------------
def test_report_page_from_a_few_results(model_args, capsys):
    task3.main(model_args)
    (settings.results_dir() / "task_3_kv_cache_problem.txt").write_text(
        capsys.readouterr().out)
    save_hand_results()
    page = html_report.write().read_text()
    for name in html_report.step_names():
        assert f'<h2 id="{name}">' in page
    # a step with no saved result says so, with the command; one with a report shows it
    assert "not run yet: python task_5_api_server.py" in page
    assert "<h2 id=\"task_3_kv_cache_problem\">Task 3: The KV Cache Problem - Why Memory " \
           "Matters</h2>" in page
    assert "Memory utilization:" in page
    assert "No report text saved" in page                  # task 6: a result without its text
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 7                                # tasks 3, 6, 7, 9 (2), 10, summary
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert "src=\"http" not in page and "href=\"http" not in page   # opens offline


def test_report_page_in_a_real_browser(model_args, tmp_path, capsys):
    """The page as an instructor opens it: every image loaded, no console error, every step's
    section there. Saves a screenshot in the test's folder."""
    from selenium.webdriver.common.by import By

    from tests.test_dashboard import chromium

    task3.main(model_args)
    task4.main(model_args)
    save_hand_results()
    capsys.readouterr()
    page = html_report.write()
    driver, profile = chromium()
    try:
        driver.set_window_size(1000, 1300)
        driver.get(page.as_uri())
        images = driver.find_elements(By.TAG_NAME, "img")
        assert len(images) == 8
        widths = [driver.execute_script("return arguments[0].complete && "
                                        "arguments[0].naturalWidth", img) for img in images]
        assert all(w and w > 0 for w in widths), widths
        assert [e for e in driver.get_log("browser") if e["level"] == "SEVERE"] == []
        ids = [h.get_attribute("id") for h in driver.find_elements(By.TAG_NAME, "h2")]
        assert ids == html_report.step_names()
        shot = tmp_path / "report.png"   # pytest keeps the last 3 runs' under its basetemp
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 20_000
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
