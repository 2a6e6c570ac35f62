"""Tasks 6 and 7 without a server: their records saved and read back whole, the summary's rows,
and what their figures plot, on results typed in by hand (tests/hand/: the matrix, never the
pixels). The runs against a real server are in tests/tasks/test_server_tasks.py (task 6) and, on the
real model, the lab's quick run (task 7's restarts); the KEY INSIGHT lines in
tests/tasks/test_reports.py, their limits (bullets, lines) here, on every branch."""
from __future__ import annotations

import pytest

import task_6_multi_user_load as task6
import task_7_tuning as task7
from common import figures, kv, report, results, settings, steps
from common.load import LoadLevel, RequestResult
from common.measure import Spread
from lessons import task_6 as lesson_6
from lessons import task_7 as lesson_7
from lessons.task_6 import record as task6_record
from lessons.task_6 import report as task6_report
from lessons.task_7 import report as task7_report
from lessons.task_7.record import ConfigRun, TuningConfig
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
    # configs B and C hold the same KV blocks: max_num_seqs reserves no memory, and the
    # insight says so from the figures (no "128 -> 64" typed in, no "both divide the same
    # budget"); nor does max_model_len, whatever the figures (a paged cache)
    assert configs[1]["num_kv_blocks"] == configs[2]["num_kv_blocks"] == \
        t2["kv_capacity_engine"]["num_blocks"]
    out = " ".join(lab_run.out.split())
    memory = out.partition("max_num_seqs reserves no memory either")[2].partition(".")[0]
    assert_says(memory, f"the same {configs[2]['num_kv_blocks']} blocks as B's",
                not_branch="against B")
    assert "max_model_len caps a request's length; it reserves no KV memory" in out
    assert "sets the KV memory" not in out and "Both are knobs" not in out
    assert configs[2]["peak_num_requests_running"] <= 8
    assert all(c["level"]["num_ok"] == 10
               and c["level"]["num_output_tokens"] == 10 * QUICK_TOKENS for c in configs)


# --- the KEY INSIGHT keeps its limits, on every branch --------------------------------------------
def printed_insight(lines: list[str], capsys) -> list[str]:
    """The KEY INSIGHT as report.insight prints it: its lines between the heading and the rule."""
    capsys.readouterr()
    report.insight(lines)
    out = capsys.readouterr().out.splitlines()
    return out[out.index("KEY INSIGHT:") + 1:-1]


def assert_insight_fits(lines: list[str], capsys) -> None:
    printed = printed_insight(lines, capsys)
    assert len(lines) <= report.MAX_INSIGHT_BULLETS, lines
    assert len(printed) <= report.MAX_INSIGHT_LINES, "\n".join(printed)
    assert all(len(line) <= report.WIDTH for line in printed)
    assert all(line.endswith(".") for line in lines), lines       # whole sentences


def load_level(users: int, duration_s: float, latency_s: float, ttft_s: float, failed: int = 0,
               concurrent: bool = True) -> LoadLevel:
    """users requests of 50 tokens, failed of them failing; sent one after another when not
    concurrent (the k-th at k x latency_s)."""
    ok = [RequestResult(True, 50, 10, ttft_s, latency_s, start_s=k * latency_s * (not concurrent))
          for k in range(users - failed)]
    return LoadLevel.of(ok + [RequestResult(False, error="boom")] * failed, duration_s,
                        is_concurrent=concurrent)


@pytest.mark.parametrize("largest, sequential", [
    ((20, 12.34, 11.11, 0.55), (20, 1.23)),                   # scales, batched, measured in line
    ((20, 12.34, 11.11, 0.55), None),                          # ... computed (--no-sequential)
    ((20, 123.45, 123.45, 88.88), (20, 1.23)),                 # barely grew, queued, measured
    ((20, 123.45, 123.45, 88.88), None),                       # ... computed
    ((20, 12.34, 1.25, 0.55), (20, 1.23)),                     # latency hardly changed
])
def test_task6_insight_keeps_its_limits(largest, sequential, capsys):
    one = load_level(1, 1.23, 1.23, 0.04)
    big = load_level(*largest)
    seq = (load_level(sequential[0], sequential[0] * sequential[1], sequential[1], 0.04,
                      concurrent=False) if sequential else None)
    alone = task6_record.alone_of([one, one, one], seq)
    in_line = task6_record.in_line_ttft_s(seq) if seq else None
    assert_insight_fits(task6_report.insights([one, big], seq, alone, in_line), capsys)
    # with a failure counted first: one more bullet, still within the limits
    failing = load_level(largest[0], largest[1], largest[2], largest[3], failed=3)
    assert_insight_fits(task6_report.insights([one, failing], seq, alone, in_line), capsys)
    # nothing to compare
    assert_insight_fits(task6_report.insights([one, load_level(5, 1.0, 0.0, 0.0, failed=5)],
                                              seq, alone, in_line), capsys)


def tuning_run(label: str, max_model_len: int, max_num_seqs: int, blocks: int | None,
               concurrency: float, running: int, waiting: int, spread: tuple | None,
               samples: int = 45) -> ConfigRun:
    tok_s = spread[0] if spread else 1234.5
    passes = Spread(*spread, 3) if spread else Spread(tok_s, tok_s, tok_s, 1)
    return ConfigRun(TuningConfig(label, max_model_len, max_num_seqs), "restarted", concurrency,
                     LoadLevel(10, 10, 500 / tok_s, 500, tok_s), num_kv_blocks=blocks,
                     kv_block_size_tokens=16, peak_num_requests_running=running,
                     peak_num_requests_waiting=waiting, num_metrics_samples=samples,
                     spread=passes)


@pytest.mark.parametrize("b_concurrency, c_blocks, spreads, c_peak", [
    (91.0, 364, ((229.8, 225.0, 233.5), (229.9, 229.7, 240.9), (147.2, 146.9, 147.4)), (8, 2)),
    (45.5, 363, ((1229.8, 1225.0, 1233.5), (1329.9, 1329.7, 1340.9), (1147.2, 1146.9, 1147.4)),
     (0, 0)),
    (91.0, None, (None, None, None), (8, 0)),
])
def test_task7_insight_keeps_its_limits(b_concurrency, c_blocks, spreads, c_peak, capsys):
    rows = [tuning_run("A: Default", 128, 256, 364, 45.5, 10, 0, spreads[0]),
            tuning_run("B: Shorter Context", 64, 256, 364, b_concurrency, 10, 0, spreads[1]),
            tuning_run("C: Limited Concurrency", 64, 8, c_blocks, b_concurrency, *c_peak,
                       spreads[2])]
    lines = task7_report.insights(rows, 10)
    assert_insight_fits(lines, capsys)
    # a paged cache: whatever the figures, max_model_len reserves no memory
    assert "reserves no KV memory" in lines[0] and "sets the KV memory" not in lines[0]


def test_task6_value_labels_stand_above_their_error_bars():
    """Issue 48: the labels collided with the bars. Each label stands at the top of its level's
    range (the highest pass), and the axes leave room above the highest."""
    six = hand_load()
    six.num_passes = 3
    six.spreads = [Spread(lv.tokens_per_s, 0.8 * lv.tokens_per_s, 1.1 * lv.tokens_per_s, 3)
                   for lv in six.levels]
    fig = lesson_6.draw_load_levels(six)
    tps = fig.axes[0]
    labels = [t for t in tps.texts if t.get_text() in {f"{lv.tokens_per_s:.1f}"
                                                       for lv in six.levels}]
    assert [t.xy for t in labels] == [(lv.num_users, s.high)
                                      for lv, s in zip(six.levels, six.spreads)]
    assert all(t.get_va() == "bottom" and t.xyann[1] > 0 for t in labels)   # above the cap
    assert tps.get_ylim()[1] > max(s.high for s in six.spreads)
    figures.plt().close(fig)
