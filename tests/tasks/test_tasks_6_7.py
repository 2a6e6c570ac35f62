"""Tasks 6 and 7 without a server: their records saved and read back whole, the summary's rows,
and what their figures plot, on results typed in by hand (tests/hand/: the matrix, never the
pixels). The runs against a real server are in tests/tasks/test_server_tasks.py (task 6) and, on the
real model, the lab's quick run (task 7's restarts: the last test here); the KEY INSIGHT lines in
tests/tasks/test_reports.py."""
from __future__ import annotations

import pytest

import task_6_multi_user_load as task6
import task_7_tuning as task7
from common import figures, kv, results, settings, steps
from common.load import LoadLevel
from lessons import task_6 as lesson_6
from lessons import task_7 as lesson_7
from tests import hand
from tests.hand.task_6_multi_user_load import SUMMARY_ROW as ROW_6
from tests.hand.task_6_multi_user_load import record as hand_load
from tests.hand.task_7_tuning import SUMMARY_ROW as ROW_7
from tests.hand.task_7_tuning import record as hand_tuning
from tests.helpers import BYTES_PER_TOKEN, QUICK_TOKENS, assert_says, save_hand_results


def test_the_records_read_back_whole():
    records = hand.save_all()    # stamped with when and where, as the scripts save them
    six, seven = records[task6.SCRIPT], records[task7.SCRIPT]
    by_name = steps.by_name()
    assert by_name[task6.SCRIPT].record is task6.MultiUserLoad
    assert by_name[task7.SCRIPT].record is task7.Tuning
    assert by_name[task6.SCRIPT].load() == six and by_name[task7.SCRIPT].load() == seven
    # nothing of a level's raw requests is saved; what was not measured is left out
    saved = results.load_raw(task6.SCRIPT, "")
    assert set(saved["levels"][0]) == {
        "num_users", "num_ok", "duration_s", "num_output_tokens", "tokens_per_s",
        "mean_latency_s", "p50_latency_s", "p95_latency_s", "mean_ttft_s", "mean_tpot_s",
        "errors", "is_concurrent"}
    assert saved["sequential"]["is_concurrent"] is False
    assert results.load_raw(task7.SCRIPT, "")["configs"][2]["config"] == {
        "label": "C: Limited Concurrency", "max_model_len": 64, "max_num_seqs": 8}


def test_the_summary_rows():
    six, seven = hand_load(), hand_tuning()
    assert lesson_6.summary_row(six) == ROW_6 == "20 users 80.0 tok/s (4.2x)"
    six.levels = [LoadLevel(1, 0, 1.0, 0, 0.0, errors=["boom"])]
    assert lesson_6.summary_row(six) == "no level made a token"
    assert lesson_7.summary_row(seven) == ROW_7
    # A against B and B against C by their passes' spreads (both ways: test_reports.py)
    assert_says(ROW_7, "A 72.0", "B 74.0", "C 60.0", "A, B not told apart", "C below B",
                not_branch=("above", "1 pass"))


def test_what_the_load_and_tuning_figures_plot():
    res = save_hand_results()    # as the report page draws them: saved and loaded back
    six, seven = res[task6.SCRIPT], res[task7.SCRIPT]
    fig = lesson_6.draw_load_levels(six)
    tps, lat, seq = fig.axes
    assert list(tps.lines[0].get_xdata()) == [1, 5, 10, 20]
    assert list(tps.lines[0].get_ydata()) == [13.16, 35.71, 55.56, 80.0]   # 50 x users / s
    assert [line.get_label() for line in lat.lines] == ["p50 latency", "p95 latency",
                                                        "mean time to first token"]
    assert list(lat.lines[1].get_ydata()) == [3.8, 7.0, 9.0, 12.5]          # p95
    assert [b.get_height() for b in seq.patches] == [76.0, 12.5]           # one by one, together
    figures.plt().close(fig)
    fig = lesson_7.draw_tuning(seven)
    tps, lat, peak = fig.axes
    assert [b.get_height() for b in tps.patches] == [72.0, 74.0, 60.0]     # median passes
    # the spread of each: the median pass down to the lowest, up to the highest
    (_, caps, (spread_lines,)), = tps.containers[1:]
    assert [list(map(tuple, seg)) for seg in spread_lines.get_segments()] == [
        [(0, 70.0), (0, 75.0)], [(1, 71.0), (1, 78.0)], [(2, 57.0), (2, 62.0)]]
    # one colour, one meaning: every throughput bar the same; no colour of one panel in another
    colours = [{tuple(p.get_facecolor()) for p in ax.patches} for ax in (tps, lat, peak)]
    assert len(colours[0]) == 1 and len(colours[1]) == 3 and len(colours[2]) == 2
    assert not (colours[0] & colours[1] or colours[0] & colours[2] or colours[1] & colours[2])
    assert [b.get_height() for b in lat.patches] == pytest.approx(   # mean, p50, p95
        [6.9, 6.7, 8.3, 6.9, 6.7, 8.3, 6.9 * 1.1, 6.7 * 1.1, 8.3 * 1.1])
    assert [b.get_height() for b in peak.patches] == [10, 10, 8, 0, 0, 2]   # running, waiting
    figures.plt().close(fig)


def test_a_level_no_request_of_which_succeeded_is_left_out_and_no_sequential_says_so():
    six = hand_load()
    six.levels[1] = LoadLevel(5, 0, 1.0, 0, 0.0, errors=["boom"])
    six.sequential = None
    fig = lesson_6.draw_load_levels(six)
    tps, lat, seq = fig.axes
    assert list(tps.lines[0].get_xdata()) == [1, 10, 20]
    assert len(seq.patches) == 0 and "--no-sequential" in seq.texts[0].get_text()
    figures.plt().close(fig)


@pytest.mark.parametrize("name", [task6.SCRIPT, task7.SCRIPT])
def test_the_figures_have_a_title_axes_with_units_and_a_caption(name):
    save_hand_results()
    step = steps.by_name()[name]
    res = step.load()
    assert [suffix for suffix, _ in step.figures] == [""]
    for _, draw in step.figures:
        fig = draw(res)
        assert fig.get_suptitle()
        caption = fig.get_supxlabel()
        assert "float32" in caption and "cores" in caption, caption
        assert res.measured_at[:10] in caption and settings.cpu_model_name() in caption
        for ax in fig.axes:
            # an axes that plots something names what it plots: an x or a y label with text
            if ax.axison and ax.has_data():
                assert [label for label in (ax.get_xlabel(), ax.get_ylabel()) if label.strip()], \
                    (name, ax.get_title(), "no x or y label")
        figures.plt().close(fig)
    drawn = figures.draw(name, res, step.figures)
    assert [(path.name, why) for path, why in drawn] == [(f"{name}.png", None)]
    assert drawn[0][0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.lab_steps("task_2_vllm_inference", "task_7_tuning")
def test_task_7_on_the_real_model_restarts_the_server_for_each_config(lab_run):
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
    memory = lab_run.out.partition("max_num_seqs divides no memory")[2].partition(";")[0]
    assert_says(memory, f"the same {configs[2]['num_kv_blocks']} blocks", not_branch="against B")
    assert "Both are knobs" not in lab_run.out
    assert configs[2]["peak_num_requests_running"] <= 8
    assert all(c["level"]["num_ok"] == 10
               and c["level"]["num_output_tokens"] == 10 * QUICK_TOKENS for c in configs)
