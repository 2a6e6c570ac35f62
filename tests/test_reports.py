"""What the reports print: every line within the 65 columns the report rules out, values in
their column whatever the label, and every KEY INSIGHT chosen from the figures it explains
(tasks 6, 7, 8 on given figures: the lines change when the figures do). Cheap: no engine, no
server; tasks 3-4 run in full on the tiny model."""
from __future__ import annotations

import dataclasses
import re

import pytest

import task_2_vllm_inference as task2
import task_3_kv_cache_problem as task3
import task_4_paged_attention as task4
import task_6_multi_user_load as task6
import task_7_tuning as task7
import task_8_dashboard as task8
from common import kv, load, report
from common.load import LoadLevel, RequestResult
from tests.conftest import assert_fits
from tests.says import assert_says


# --- the printer ------------------------------------------------------------------------------
def test_a_long_label_gets_its_own_line_and_the_value_keeps_its_column(capsys):
    report.row("A label far longer than the label column", "42")
    report.row("Short", "a value long enough that it has to wrap under itself, not the label")
    report.row("  path", "/a/path/" + "x" * 40)
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "A label far longer than the label column:",
        " " * 34 + "42",
        "Short:                            a value long enough that it has",
        " " * 34 + "to wrap under itself, not the",
        " " * 34 + "label",
        "  path:",
        "    /a/path/" + "x" * 40]          # a word too long for the value column: next line
    assert_fits(out)


def test_a_table_cell_wraps_inside_its_column(capsys):
    report.table(["Step", "Figure"], [("1", "a figure too long for its column here")],
                 widths=[5, 20], align_left=(0, 1))
    assert capsys.readouterr().out.splitlines() == [
        "Step Figure", "-" * 25, "1    a figure too long", "     for its column here"]
    with pytest.raises(AssertionError):
        report.table(["a", "b"], [], widths=[40, 30])     # wider than the report


@pytest.fixture(scope="module")
def model_args(tiny_model):
    return ["--model", tiny_model, "--dtype", "float32"]


@pytest.mark.parametrize("task", [task3, task4])
def test_kv_tasks_fit_65_columns(task, model_args, capsys):
    task.main(model_args)
    out = capsys.readouterr().out
    assert_fits(out)
    assert out.count("\nModel:") == 1                    # the model row once per report
    assert "[45, 128" not in out                         # no Python list printed raw


def test_task_3_says_how_vllm_cuts_the_budget_into_blocks(model_args, capsys):
    """The tiny model: 128 MiB / 1,024 B = 131,072 slots = 8,192 whole blocks of 16, nothing
    left over (the real model in fp32: 2,912 slots = 182 x 16; with blocks of 128 it would be
    22 x 128 = 2,816, and the note would name the 96 slots left)."""
    r = task3.main(model_args).in_bytes
    assert (r.budget_token_slots, r.budget_blocks, r.block_size_tokens) == (131_072, 8_192, 16)
    out = " ".join(capsys.readouterr().out.split())
    assert ("(vLLM allocates whole blocks of 16 tokens: task 2 checks 131,072 against its "
            "engine)") in out


# --- task 2: the KV check compares the engine with what the lab asked for ---------------------
def test_task2_capacity_check_can_fail(capsys):
    model_kv = kv.ModelKV(num_layers=2, num_kv_heads=1, head_dim=64, dtype="float32",
                          dtype_bytes=4)                     # 1,024 B per token
    as_asked = kv.KVCapacity(num_blocks=1_024, block_size=128, max_model_len=128)
    assert task2.compare_capacity(as_asked, model_kv, 128, 128) == (as_asked, True)
    # an engine with 16-token blocks (8,192 of them) where 128 were asked for disagrees
    other = kv.KVCapacity(num_blocks=8_192, block_size=16, max_model_len=128)
    derived, agree = task2.compare_capacity(other, model_kv, 128, 128)
    assert (derived, agree) == (as_asked, False)
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "Engine and config agree" in out     # the first call agreed
    assert_fits(out)


# --- task 6: the insight from the levels ------------------------------------------------------
def level(users: int, duration_s: float, latency_s: float, ttft_s: float, tokens: int = 50,
          failed: int = 0) -> LoadLevel:
    ok = [RequestResult(True, tokens, 10, ttft_s, latency_s)] * (users - failed)
    return LoadLevel.of(ok + [RequestResult(False, error="boom")] * failed, duration_s)


def test_task6_insight_when_throughput_scales():
    # 1 user: 50 tokens in 5.0 s = 10.0 tok/s; 20 users: 1,000 tokens in 10.0 s = 100.0 tok/s:
    # 10.0x, past SCALES_AT (1.5x). TTFT 0.50 s at 20 users, under one request alone (5.00 s):
    # batched as they came. Latency 9.00 / 5.00 = 1.8x, past LATENCY_ROSE_AT (1.1x)
    lines = task6.insights([level(1, 5.0, 5.0, 0.2), level(20, 10.0, 9.0, 0.5)], None)
    assert len(lines) == 3
    assert_says(lines[0], "10.0x", "1 to 20 users", "10.0 -> 100.0 tok/s",
                branch="SCALES", not_branch=("barely grew", "each step took"))
    assert_says(lines[1], "20 requests", "0.50 s", "5.00 s",
                branch="continuous batching", not_branch="queued")
    assert_says(lines[2], "5.00 s alone", "9.00 s", "(1.8x)", "20 users", "10.0x",
                branch=("latency rose", "while throughput rose"),
                not_branch=("hardly changed", "little more throughput"))
    # the 20 requests' latency 5.20 s, under 1.1 x 5.00 = 5.50 s: it hardly changed
    lines = task6.insights([level(1, 5.0, 5.0, 0.2), level(20, 10.0, 5.2, 0.5)], None)
    assert_says(lines[2], "5.00 s alone", "5.20 s at 20 users",
                branch="hardly changed", not_branch=("latency rose", "throughput rose"))


def test_task6_insight_when_it_does_not():
    # 4 users: 200 tokens in 18.0 s = 11.1 tok/s against 10.0: 1.1x, under SCALES_AT; a step
    # (18.0 - 6.0) / 49 = 245 ms against (5.0 - 0.2) / 49 = 98 ms: 2.5x as long. TTFT 6.00 s,
    # longer than one request alone (5.00 s): queued. Latency 18.00 / 5.00 = 3.6x
    lines = task6.insights([level(1, 5.0, 5.0, 0.2), level(4, 18.0, 18.0, 6.0)], None)
    assert len(lines) == 3
    assert_says(lines[0], "1.1x", "1 to 4 users", "10.0 -> 11.1 tok/s", "2.5x", "4 requests",
                branch=("barely grew", "each step took"), not_branch="SCALES")
    assert_says(lines[1], "4 users", "6.00 s", "5.00 s",
                branch="queued", not_branch="continuous batching")
    assert_says(lines[2], "5.00 s alone", "18.00 s", "(3.6x)", "4 users",
                branch=("latency rose", "with little more throughput"),
                not_branch=("while throughput rose", "hardly changed"))
    assert not any("SCALES" in line or "continuous batching" in line for line in lines)


def test_task6_insight_counts_failures_and_a_dead_level_prints_dashes():
    dead = level(5, 1.0, 0.0, 0.0, failed=5)
    lines = task6.insights([level(1, 5.0, 5.0, 0.2), dead], level(5, 2.0, 1.0, 0.1, failed=2))
    # 5 of the level of 5 and 2 of the sequential 5 failed: 7 of 1 + 5 + 5 = 11 sent
    assert len(lines) == 2
    assert_says(lines[0], "7 of 11 requests", branch="FAILED")
    # the largest level has no request that succeeded: no figure to compare
    assert_says(lines[1], "1, 5 user(s)", branch="Nothing to compare",
                not_branch=("SCALES", "barely grew"))
    assert load.seconds(dead.mean_latency_s) == "-"
    assert dead.mean_latency_s is None and dead.num_failed == 5 and dead.num_ok == 0
    # saved as measured: nothing measured is left out, and it reads back the same
    assert "mean_latency_s" not in dead.to_dict() and dead.to_dict()["errors"] == ["boom"]
    assert LoadLevel.from_dict(dead.to_dict()) == dead
    # nothing failed: no line counts failures
    assert not any("FAILED" in line
                   for line in task6.insights([level(1, 5.0, 5.0, 0.2), level(4, 8.0, 7.0, 0.3)],
                                              None))


def test_task6_scaling_factor_and_per_user_speed_by_hand(capsys):
    # 1 user: 50 tokens in 5.0 s = 10.0 tok/s; 4 users: 200 tokens in 8.0 s = 25.0 tok/s;
    # 20 users: 1,000 tokens in 12.5 s = 80.0 tok/s. Peak / first = 80 / 10 = 8.0x.
    # Per user: 10.0, 25 / 4 = 6.25, 80 / 20 = 4.0 tok/s; TPOT (5.0 - 0.2) / 49 = 98 ms.
    levels = [level(1, 5.0, 5.0, 0.2), level(4, 8.0, 7.0, 0.3), level(20, 12.5, 11.0, 0.5)]
    assert task6.print_scaling(levels) == 8.0
    out = capsys.readouterr().out
    assert "Scaling factor:                   8.0x throughput improvement" in out
    assert "   1 users:   10.0 tok/s each, time per output token 98 ms" in out
    assert "   4 users:    6.2 tok/s each" in out            # 6.25, printed to one place
    assert "  20 users:    4.0 tok/s each" in out
    assert task6.print_scaling([level(1, 5.0, 0.0, 0.0, failed=1), levels[2]]) == 0.0


def sequential_of(users: int, latency_s: float, tokens: int = 50) -> LoadLevel:
    """users requests one after another, each alone: latency_s each, TTFT 0.2 s."""
    requests = [RequestResult(True, tokens, 10, 0.2, latency_s)] * users
    return LoadLevel.of(requests, users * latency_s, is_concurrent=False)


def test_task6_one_request_alone_is_checked_two_ways(capsys):
    # The source's story of a 1-user level measured once as an outlier: its passes made 50
    # tokens in 10.0, 9.0 and 10.5 s (5.0, 5.6, 4.8 tok/s; median 5.0), where 20 requests one
    # after another took 5.0 s each (10.0 tok/s): 4.8-5.6 and 10.0-10.0 do not overlap. The
    # baseline is the sequential requests (20 passes against 3): 80 / 10 = 8.0x, not 16.0x
    one_user = [level(1, 10.0, 10.0, 0.2), level(1, 9.0, 9.0, 0.2), level(1, 10.5, 10.5, 0.2)]
    twenty = level(20, 12.5, 6.0, 0.5)                                  # 1,000 / 12.5 = 80.0
    seq = sequential_of(20, 5.0)
    alone = task6.alone_of(one_user, seq)
    assert not alone.agree and alone.used == task6.SEQUENTIAL
    assert (alone.level.median, alone.level.low, alone.level.high) == (5.0, 50 / 10.5, 50 / 9.0)
    assert (alone.tokens_per_s, alone.latency_s) == (10.0, 5.0)
    levels = [one_user[0], twenty]
    spreads = [alone.level, task6.measure.Spread.of([76.0, 80.0, 84.0])]
    assert task6.print_scaling(levels, spreads, alone, 20) == 8.0
    out = " ".join(capsys.readouterr().out.split())
    assert_says(out, "the 1-user level: 5.0 (4.8-5.6, 3 passes)",
                "the 20 requests one after another: 10.0 (10.0-10.0, 20 requests)",
                "the sequential requests", "10.0 tok/s", "8.0x",
                "(7.6-8.4 from the spreads)",                              # 76 / 10, 84 / 10
                branch="They DISAGREE", not_branch="They agree")
    # the insight reads latency against one request alone, the sequential 5.00 s: 6.00 s at
    # 20 users is 1.2x, a rise; against the outlier's 10.00 s it would have "hardly changed"
    lines = task6.insights(levels, seq, alone)
    assert_says(lines[0], "8.0x", "10.0 -> 80.0 tok/s", branch="SCALES")
    assert_says(lines[2], "5.00 s alone", "6.00 s", "(1.2x)", branch="latency rose",
                not_branch="hardly changed")
    assert_says(task6.insights(levels, seq)[2], "10.00 s alone", branch="hardly changed",
                not_branch="latency rose")

    # passes of 5.0 s each, as the sequential requests: they agree; the 1-user level is the
    # baseline, 80 / 10 = 8.0x, and its median pass gives the latency alone
    steady = [level(1, 5.0, 5.0, 0.2), level(1, 5.2, 5.2, 0.2), level(1, 4.9, 4.9, 0.2)]
    alone = task6.alone_of(steady, sequential_of(20, 5.1))
    assert alone.agree and alone.used == task6.LEVEL
    assert (alone.tokens_per_s, alone.latency_s) == (10.0, 5.0)
    assert task6.print_scaling([steady[0], twenty], spreads, alone, 20) == 8.0
    out = " ".join(capsys.readouterr().out.split())
    assert_says(out, "the 1-user level", branch="They agree", not_branch="DISAGREE")
    # no sequential requests (--no-sequential): the level alone, nothing to check it against
    alone = task6.alone_of(one_user, None)
    assert alone.agree and alone.used == task6.LEVEL and alone.sequential is None


def test_task6_levels_take_turns_and_keep_their_median_pass():
    passes = [[level(1, 10.0, 10.0, 0.2), level(1, 5.0, 5.0, 0.2), level(1, 6.0, 6.0, 0.2)],
              [level(4, 8.0, 7.0, 0.3), level(4, 9.0, 8.0, 0.3), level(4, 7.0, 6.0, 0.3)]]
    # tok/s 5.0, 10.0, 8.3: the median pass is the third; 25.0, 22.2, 28.6: the first
    assert task6.median_passes(passes) == [passes[0][2], passes[1][0]]


def test_task2_speedup_by_hand(capsys):
    # vLLM: 50 tokens in 2.0 s = 25.0 tok/s; HuggingFace: 12.5 tok/s (4.0 s): 25 / 12.5 = 2.0x
    gen = task2.engine.Generation("vLLM", "text", 11, 50, 2.0, 9.0, 2)
    saved = task2.engine.OneRequest.of(gen, task2.engine.Sampling("p", 50, 0.7, 42),
                                       task2.results.RunHeader())
    assert gen.tokens_per_s == 25.0 and saved.tokens_per_s == 25.0
    eng = task2.engine.Engine(None, 9.0, {})
    speedup = task2.print_results(gen, eng, task2.Baseline("measured now", 12.5, 4.0))
    assert speedup == 2.0
    out = capsys.readouterr().out
    assert "vLLM is 2.0x faster in tokens/sec" in out
    assert re.search(r"\nTokens/sec +12\.5 +25\.0\n", out)
    # the other way round: 12.5 against 25.0 is 0.5x, "as fast" is not claimed as faster
    task2.print_results(task2.engine.Generation("vLLM", "", 11, 50, 4.0, 9.0, 2), eng,
                        task2.Baseline("measured now", 25.0, 2.0))
    assert "vLLM is 0.5x as fast in tokens/sec" in capsys.readouterr().out


# --- task 7: the insight from the three configs -----------------------------------------------
def config(label, max_model_len, max_num_seqs, blocks, concurrency, running, waiting, tok_s):
    # 10 requests of 50 tokens; the duration gives the level its tok/s
    measured = LoadLevel(10, 10, 500 / tok_s, 500, tok_s)
    return task7.ConfigRun(task7.TuningConfig(label, max_model_len, max_num_seqs), "started",
                           concurrency, measured, num_kv_blocks=blocks, kv_block_size_tokens=128,
                           peak_num_requests_running=running, peak_num_requests_waiting=waiting)


def test_task7_insight_from_the_configs():
    rows = [config("A: Default", 128, 256, 22, 22.0, 10, 0, 80.0),
            config("B: Shorter Context", 64, 256, 22, 22.0, 10, 0, 81.0),
            config("C: Limited Concurrency", 64, 8, 22, 22.0, 8, 2, 60.0)]
    lines = task7.insights(rows, 10)
    assert len(lines) == 3
    # 128-token blocks: 64 tokens hold ceil(64 / 128) = 1, 128 tokens 1, so B fits no more
    # requests than A (22x each): the line says why, in whole blocks
    assert_says(lines[0], "128-token", "64 tokens hold 1", "128 tokens 1", "22x", "22x",
                branch="in whole", not_branch="took the engine from")
    # C: 8 ran and 2 waited at max_num_seqs=8, 60.0 tok/s against B's 81.0 at 256
    assert_says(lines[1], "max_num_seqs=8", "8 ran", "2 waited", "60.0 tok/s", "81.0",
                "max_num_seqs=256",
                branch="caps the batch", not_branch=("capped nothing", "not observed"))
    # C's 22 blocks, B's 22: the same cache
    assert_says(lines[2], "22 blocks", branch=("divides no memory", "the same"),
                not_branch="against B's")
    # C's cache of 11 blocks against B's 22 (another run's memory): named, not "the same"
    other = [*rows[:2], dataclasses.replace(rows[2], num_kv_blocks=11)]
    assert_says(task7.insights(other, 10)[2], "11 blocks", "B's 22",
                branch=("divides no memory", "against B's"), not_branch="the same")
    # an engine that exports no block count: no line about C's memory
    other[2] = dataclasses.replace(rows[2], num_kv_blocks=None)
    assert not any("memory:" in line for line in task7.insights(other, 10))
    assert len(task7.insights(other, 10)) == 2
    # 16-token blocks: 64 tokens hold 4, 128 hold 8, so B fits twice A; and C saw nothing wait
    rows[1] = dataclasses.replace(rows[1], kv_max_concurrency=44.0)
    rows[2] = dataclasses.replace(rows[2], peak_num_requests_running=6,
                                  peak_num_requests_waiting=0)
    lines = task7.insights(rows, 6)
    assert_says(lines[0], "128 -> 64 tokens", "22x", "44x",
                branch="took the engine from", not_branch="in whole")
    assert_says(lines[1], "max_num_seqs=8", "6 of the 6 requests",
                branch="capped nothing", not_branch=("caps the batch", "not observed"))
    # /metrics never answered while C's requests ran (a busy 2-core machine): not observed,
    # never "capped nothing" from a read taken before the load
    rows[2] = dataclasses.replace(rows[2], peak_num_requests_running=0, num_metrics_samples=1)
    assert_says(task7.insights(rows, 10)[1], "max_num_seqs=8", "1 time(s)",
                branch="not observed", not_branch=("capped nothing", "caps the batch"))


# --- task 8: the insight from the snapshot ----------------------------------------------------
def snap(running, waiting, kv_usage):
    """Task 8's Snapshot of a /metrics read with this batch (the insight reads nothing else)."""
    from common import metrics

    read = metrics.Snapshot(0.0, 0.0, running, waiting, kv_usage, 0.0, 0.0, 0.0, 0.0, 0.0)
    return task8.Snapshot.of(read, read)


def test_task8_insight_from_the_snapshot():
    assert_says(task8.insight_lines(snap(0, 0, 0.0), 0.0, 8)[1], "0 requests running",
                branch="idle", not_branch="one batch")
    lines = task8.insight_lines(snap(8, 12, 0.364), 61.04, 8)
    assert len(lines) == 3
    assert lines[0] == task8.show.PRODUCTION      # whatever the figures: /metrics in production
    # 61.04 tok/s, to one place
    assert_says(lines[1], "8 requests", "61.0 tok/s", branch="one batch")
    # 8 running at max_num_seqs=8 with 12 waiting, the cache 36.4% full (under KV_FULL, 90%)
    assert_says(lines[2], "max_num_seqs=8", "8 ran", "12 waited", "36.4%",
                branch=("capped the batch", "not the memory"),
                not_branch=("the memory capped", "None waited"))
    # 44 running under max_num_seqs=256, 56 waiting, the cache 100% full: the memory
    assert_says(task8.insight_lines(snap(44, 56, 1.0), 260.0, 256)[2], "100.0%", "56 waited",
                branch="the memory capped the batch",
                not_branch=("max_num_seqs=", "None waited"))
    # nothing waiting: all 20 fit, in 45.5% of the cache
    assert_says(task8.insight_lines(snap(20, 0, 0.455), 150.0, 256)[2], "all 20 fit", "45.5%",
                branch="None waited", not_branch="capped")
    # a server that exports no KV usage and no rate: no cache to blame, nothing per second.
    # The line is its two counts and nothing else, so it is compared whole
    lines = task8.insight_lines(snap(3, 2, None), None, None)
    assert_says(lines[1], "3 requests", branch="one batch", not_branch="tok/s")
    assert lines[2] == "2 waited, with 3 running"
    # the same batch, the cache half full: under KV_FULL and max_num_seqs not given, so no limit
    # is named, only the cache's share
    assert_says(task8.insight_lines(snap(3, 2, 0.5), None, None)[2], "2 waited", "3 running",
                "50.0%", not_branch="capped")
