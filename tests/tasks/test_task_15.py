"""Task 15: its record built by hand (tests/hand/), saved and read back whole; the front door's
arithmetic (server over offline, its range, where a request's time went); the summary's row;
the insight lines each way; its report and figure printed from the record; its bad flags. The
three servers run on the real model in the lab's quick run (the last test here); mini_engine's
server alone is tests/engine/test_server.py's. Counts and arithmetic are asserted, never
times."""
from __future__ import annotations

import pytest

import task_15_serve_your_engine as task15
from common import figures, results, steps
from common.measure import Spread
from lessons.task_15 import FIGURES
from lessons.task_15 import report as task_15_report
from lessons.task_15.record import ThreeServers, summary_row
from tests.hand import assert_figure_reads_well
from tests.hand.task_15_serve_your_engine import SUMMARY_ROW
from tests.hand.task_15_serve_your_engine import record as hand_result
from tests.helpers import assert_fits, assert_says


def test_the_record_reads_back_whole():
    record = hand_result()
    results.save(task15.SCRIPT, record)
    step = steps.by_name()[task15.SCRIPT]
    assert step.record is ThreeServers and step.figures == FIGURES
    assert step.load() == record


def test_the_front_door_and_where_its_cost_went():
    vllm, mini, hf = hand_result().servers
    assert vllm.door(20) == pytest.approx(350 / 400) and vllm.door(1) == pytest.approx(1.0)
    # the lowest served pass over the highest offline one, and the other way
    assert vllm.door_range(20) == pytest.approx((345 / 405, 355 / 395))
    assert mini.door(20) == pytest.approx(0.96) and hf.door(1) == pytest.approx(1.2)
    # 49 tokens after the first: steps (54 - 50 ms) x 49, HTTP (55 - 54 ms) x 49
    assert task_15_report.costs(vllm, 20, 50) == pytest.approx(
        {"first token": 0.04, "steps": 0.196, "HTTP and streaming": 0.049})
    # no /metrics: the step and HTTP are one, (80 - 78 ms) x 49
    assert task_15_report.costs(hf, 20, 50) == pytest.approx(
        {"first token": -0.18, "steps and HTTP": 0.098})
    vllm.offline = []
    assert vllm.door(20) is None and task_15_report.costs(vllm, 20, 50) is None


def test_the_summary_row():
    record = hand_result()
    assert summary_row(record) == SUMMARY_ROW
    assert steps.by_name()[task15.SCRIPT].row(record) == SUMMARY_ROW
    record.servers[2].skipped = "port in use"
    assert summary_row(record) == ("20 users: vLLM 350, mini_engine 600 tok/s; server/offline "
                                   "0.88, 0.96")
    for run in record.servers:
        run.offline = []
    assert summary_row(record) == "20 users: vLLM 350, mini_engine 600 tok/s"
    for run in record.servers:
        run.skipped = "no"
    assert summary_row(record) == "no server ran"


def test_the_insight_says_what_the_figures_show():
    mini_vs_vllm, vllm, mini, hf, scaling = task_15_report.insights(hand_result())
    assert_says(mini_vs_vllm, "20 users", "600", "350", "1.71x", branch="their passes apart",
                not_branch="not told apart")
    assert_says(vllm, "0.88x", "20 users", "1.00x at 1", "first token +0.04 s", "steps +0.20 s",
                "HTTP and streaming +0.05 s", branch="most of the loss is its steps",
                not_branch="costs it little")
    assert_says(mini, "0.96x", "20 users", branch="the front door costs it little")
    assert_says(hf, "transformers' server kept 1.00x", "(1.20x at 1)", "first token -0.18 s",
                "steps and HTTP +0.10 s", branch="the front door costs it little")
    # transformers left out: its door at 1 user prices its offline call, not its server
    assert_says(scaling, "vLLM 8.8x (10.0x offline)", "mini_engine 12.0x (12.5x offline)",
                "0.88x", branch=("costs more at 20 users than at 1", "understates"),
                not_branch=("overstates", "transformers"))


def test_the_insight_s_other_branches():
    record = hand_result()
    vllm, mini, hf = record.servers
    mini.spreads[1] = Spread(600.0, 340.0, 610.0, 3)               # overlaps vLLM's 345-355
    hf.offline[1].tokens_per_s = Spread(200.0, 195.0, 205.0, 3)    # served 240: 1.20x
    vllm.offline[0].tokens_per_s = Spread(50.0, 45.0, 55.0, 3)     # 1 user: 0.80x, 20: 0.875x
    lines = task_15_report.insights(record)
    assert_says(lines[0], "1.71x", branch="not told apart", not_branch="their passes apart")
    assert_says(lines[3], "1.20x", "20 users", "0.40 s", "0.22 s",
                branch="does not price its front door", not_branch="kept")
    # vLLM 1.09x its engine's: still within 10 %? 0.875 / 0.8 = 1.094: yes
    assert_says(lines[4], branch="is its batching's", not_branch=("understates", "overstates"))
    vllm.offline[0].tokens_per_s = Spread(57.0, 55.0, 59.0, 3)     # 0.70x at 1: 1.25x
    assert_says(task_15_report.insights(record)[-1], "1.25x",
                branch=("costs more at 1 user than at 20", "overstates"),
                not_branch="understates")
    record.num_passes = 1
    mini.spreads = [Spread(s.median, s.median, s.median, 1) for s in mini.spreads]
    assert_says(task_15_report.insights(record)[0], branch="(one pass each)")


def test_where_the_loss_went_is_named_only_as_far_as_the_figures_go():
    record = hand_result()
    vllm = record.servers[0]
    vllm.levels[1].engine_itl_s = 0.051      # steps (51 - 50) x 49 = 0.049, HTTP 0.196
    vllm.levels[1].mean_tpot_s = 0.055
    vllm.levels[1].mean_ttft_s = 0.25        # first token +0.15: 0.15 of 0.395, 38 %
    assert_says(task_15_report.insights(record)[1], "first token +0.15 s", "steps +0.05 s",
                "HTTP and streaming +0.20 s",
                branch="its HTTP and streaming the largest part (50% of what came later)",
                not_branch="most of the loss")
    vllm.levels[1].mean_ttft_s, vllm.levels[1].engine_itl_s = 0.05, 0.049
    vllm.levels[1].mean_tpot_s = 0.049       # every part at or under offline
    assert_says(task_15_report.insights(record)[1], branch="no part of a request came later",
                not_branch=("most of the loss", "the largest part"))


def test_without_vllm_or_offline_the_insight_says_what_was_not_measured():
    record = hand_result()
    record.servers = record.servers[1:]                             # no vLLM: transformers
    for run in record.servers:
        run.offline = []
    first, last = task_15_report.insights(record)
    assert_says(first, "600", "transformers' 240", "2.50x", branch="their passes apart")
    assert_says(last, branch="(--no-offline)")
    for run in record.servers:
        run.skipped = "no"
    assert task_15_report.insights(record) == ["No server ran: nothing to compare"]


def test_a_level_with_failed_requests_prices_nothing():
    record = hand_result()
    vllm = record.servers[0]
    vllm.levels[1].num_ok, vllm.levels[1].tokens_per_s = 0, 0.0     # every request failed
    assert vllm.door(20) is None and vllm.door_range(20) is None
    lines = task_15_report.insights(record)
    assert not any(line.startswith("At 20 users") or line.startswith("vLLM's") for line in lines)


def test_the_report_and_figure_print_from_the_record(capsys):
    record = hand_result()
    task_15_report.print_report(record)
    out = capsys.readouterr().out
    assert_fits(out)
    lines = out.splitlines()
    assert any(line.split() == ["vLLM", "20", "400.0", "350.0", "0.88x", "(0.85-0.90)"]
               for line in lines)
    assert any(line.split() == ["vLLM", "20", "0.10", "->", "0.14", "50.0", "->", "54.0", "->",
                                "55.0"] for line in lines)
    # no /metrics: no engine figure
    assert ["transformers", "20", "240", "(235-245)", "0.22", "80.0", "-", "20/20"] in \
        [line.split() for line in lines]
    results.save(task15.SCRIPT, record)
    for suffix, draw in FIGURES:
        assert_figure_reads_well(draw(record), record, suffix)
    assert figures.draw(task15.SCRIPT, record, FIGURES)[0][0].is_file()


@pytest.mark.parametrize("args, message", [
    (["--servers", "nginx"], "--servers: nginx"),
    (["--servers", ","], "--servers: none given"),
    (["--users", "0"], "--users"),
    (["--passes", "0"], "--passes"),
    (["--kernels", "compiled"], "invalid choice: 'compiled'"),
])
def test_bad_flags_get_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        task15.parse_args(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_mini_engine_offline_makes_every_token(tiny_model):
    """lessons/task_15/offline.py's mini_engine way on the tiny model, in this process: the
    requests all at once, EOS held off. (vLLM's and transformers' ways run in make lab: on a
    busy test worker transformers' generate_batch took 14.5 s for one call on the tiny model,
    3 s alone: docs/tests.md.)"""
    from lessons.task_15 import offline

    run = offline.mini_engine_way(tiny_model, "float32", offline.Settings(), "torch")
    assert run(["a", "b c", "d e f"], 5) == 15 and run(["x"], 1) == 1


@pytest.mark.lab_steps("task_15_serve_your_engine")
def test_task_15_on_the_real_model(lab_run):
    """The quick lab's task 15: mini_engine's server and transformers' (vLLM's is left out:
    tasks 5-14 run it) under 1 and 20 users, every request with its tokens, mini_engine's
    /metrics read for its step; no offline runs (--no-offline: the tiny-model test above)."""
    record = ThreeServers.from_dict(lab_run.saved(task15.SCRIPT))
    assert [r.way for r in record.servers] == ["mini_engine", "transformers"]
    for run in record.servers:
        assert run.skipped is None and run.offline_error is None, run.way
        assert [(lv.num_users, lv.num_ok) for lv in run.levels] == [(1, 1), (20, 20)]
        assert all(lv.num_output_tokens == 10 * lv.num_users for lv in run.levels)
        assert run.sdk_call.completion_tokens == 10
        assert run.offline == [] and run.door(20) is None
        assert len(run.timeline.sent_s) == 20
        has_metrics = run.way != "transformers"
        if has_metrics:       # a chunk a step, one token each; transformers streams its own way
            assert [len(chunks) for chunks in run.timeline.chunk_s] == [10] * 20
        assert all((lv.engine_itl_s is not None) == has_metrics for lv in run.levels)
    assert lab_run.row(task15.SCRIPT) == summary_row(record)
