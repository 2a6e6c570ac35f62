"""What the reports print: every line within the 65 columns the report rules out, values in
their column whatever the label, and every KEY INSIGHT chosen from the figures it explains
(tasks 6, 7, 8 on given figures: the lines change when the figures do). Cheap: no engine, no
server; tasks 3-4 run in full on the tiny model."""
from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

import task_3_kv_cache_problem as task3
import task_4_paged_attention as task4
import task_7_tuning as task7
import task_8_dashboard as task8
from common import engine, kv, load, report, results
from common.load import LoadLevel, RequestResult
from common.measure import Spread
from lessons import task_7 as lesson_7
from lessons.task_2 import report as task2
from lessons.task_2.record import Baseline
from lessons.task_5 import report as task5
from lessons.task_6 import record as record6
from lessons.task_6 import report as task6
from lessons.task_6.record import LEVEL, SEQUENTIAL
from lessons.task_7 import report as show7
from lessons.task_8 import report as show8
from tests.helpers import assert_fits, assert_says


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
    note = " ".join(capsys.readouterr().out.split()).partition("(vLLM allocates")[2]
    assert_says(note, "16 tokens each", "131,072", branch=("no slot is left over", "task 2 checks"),
                not_branch=("slots left fill", "slot left fills"))


def test_the_slots_no_whole_block_holds_are_named(capsys):
    """The other way: the real model in fp32 (46,080 B a token) in 128 MiB is 2,912 slots,
    22 whole blocks of 128 = 2,816 tokens, and the note names the 96 slots left over."""
    model_kv = kv.ModelKV(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float32",
                          dtype_bytes=4)
    figures = kv.kv_bytes(model_kv, 128 * 2**20, 128, 128, slots=[], users=[])
    assert (figures.budget_tokens, figures.in_blocks.num_tokens) == (2_912, 2_816)
    kv.print_kv_bytes(SimpleNamespace(name="m", source="given", path="/m"), figures)
    note = " ".join(capsys.readouterr().out.split()).partition("(vLLM allocates")[2]
    assert_says(note, "128 tokens each", "the 96 slots left", "2,816",
                branch=("fill no block", "task 2 checks"), not_branch="no slot is left over")
    # the real model in bf16 (23,040 B a token): 5,825 slots, 364 x 16 = 5,824: one slot left,
    # said in the singular
    model_kv = dataclasses.replace(model_kv, dtype="bfloat16", dtype_bytes=2)
    figures = kv.kv_bytes(model_kv, 128 * 2**20, 16, 128, slots=[], users=[])
    assert (figures.budget_tokens, figures.in_blocks.num_tokens) == (5_825, 5_824)
    assert_says(kv.blocks_note(figures.budget_tokens, figures.in_blocks), "16 tokens each",
                "the one slot left fills no block", "5,824", not_branch="slots left")


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
def level_of(users: int, duration_s: float, latency_s: float, ttft_s: float,
             tokens: int = 50, failed: int = 0) -> LoadLevel:
    """A level measured: users requests of tokens each, all alike, failed of them failing; its
    figures from its requests (LoadLevel.of). A level given by its figures: helpers.level."""
    ok = [RequestResult(True, tokens, 10, ttft_s, latency_s)] * (users - failed)
    return LoadLevel.of(ok + [RequestResult(False, error="boom")] * failed, duration_s)


def test_task6_insight_when_throughput_scales():
    # 1 user: 50 tokens in 5.0 s = 10.0 tok/s; 20 users: 1,000 tokens in 10.0 s = 100.0 tok/s:
    # 10.0x, past SCALES_AT (1.5x). TTFT 0.50 s at 20 users; no sequential requests measured, so
    # in line, one after another, is computed: 19 / 2 x 5.0 + 0.2 = 47.70 s, and 0.50 is under
    # half of it: batched. Latency 9.00 / 5.00 = 1.8x, past LATENCY_ROSE_AT (1.1x)
    levels = [level_of(1, 5.0, 5.0, 0.2), level_of(20, 10.0, 9.0, 0.5)]
    lines = task6.insights(levels, None)
    assert len(lines) == 3
    assert_says(lines[0], "10.0x", "1 to 20 users", "10.0 -> 100.0 tok/s",
                branch="SCALES", not_branch=("barely grew", "Each step took"))
    assert_says(lines[1], "20 requests", "0.50 s", "47.70 s",
                branch=("(computed from one request alone)", "batched, not served in line",
                        "Task 9 tells continuous batching from static"),
                not_branch=("queued", "as they arrived", "when sent one after another"))
    assert record6.computed_in_line_ttft_s(20, 5.0, 0.2) == pytest.approx(47.7)
    # the 20 sent one after another, measured: each 6.0 s, the k-th sent at k x 6.0 s, its
    # first token 0.2 s later: (0 + 1 + ... + 19) / 20 x 6.0 + 0.2 = 57.20 s, not the 47.70
    # one request alone would give
    seq = sequential_of(20, 6.0)
    in_line = record6.in_line_ttft_s(seq)
    assert in_line == pytest.approx(57.2)
    assert_says(task6.insights(levels, seq, None, in_line)[1], "20 requests", "0.50 s",
                "57.20 s when sent one after another",
                branch=("came together, not in line", "Task 9"),
                not_branch=("computed", "47.70", "queued", "as they arrived"))
    assert_says(lines[2], "5.00 s alone", "9.00 s", "(1.8x)", "20 users", "10.0x",
                branch=("latency rose", "while throughput rose"),
                not_branch=("hardly changed", "little more throughput"))
    # the 20 requests' latency 5.20 s, under 1.1 x 5.00 = 5.50 s: it hardly changed
    lines = task6.insights([level_of(1, 5.0, 5.0, 0.2), level_of(20, 10.0, 5.2, 0.5)], None)
    assert_says(lines[2], "5.00 s alone", "5.20 s at 20 users",
                branch="hardly changed", not_branch=("latency rose", "throughput rose"))


def test_task6_insight_when_it_does_not():
    # 4 users: 200 tokens in 18.0 s = 11.1 tok/s against 10.0: 1.1x, under SCALES_AT; a step
    # (18.0 - 6.0) / 49 = 245 ms against (5.0 - 0.2) / 49 = 98 ms: 2.5x as long. TTFT 6.00 s,
    # over half of 3 / 2 x 5.0 + 0.2 = 7.70 s in line: queued. Latency 18.00 / 5.00 = 3.6x
    lines = task6.insights([level_of(1, 5.0, 5.0, 0.2), level_of(4, 18.0, 18.0, 6.0)], None)
    assert len(lines) == 3
    assert_says(lines[0], "1.1x", "1 to 4 users", "10.0 -> 11.1 tok/s", "2.5x", "4 requests",
                branch=("barely grew", "Each step took"), not_branch="SCALES")
    assert_says(lines[1], "4 users", "(6.00 s)", "7.70 s",
                branch=("queued", "(computed from one request alone)"),
                not_branch=("batched", "Task 9"))
    assert record6.computed_in_line_ttft_s(4, 5.0, 0.2) == 7.7
    # measured one after another (4 of 5.0 s each: 1.5 x 5.0 + 0.2 = 7.70 s): said as measured
    seq = sequential_of(4, 5.0)
    assert_says(task6.insights([level_of(1, 5.0, 5.0, 0.2), level_of(4, 18.0, 18.0, 6.0)], seq,
                               None, record6.in_line_ttft_s(seq))[1],
                "(6.00 s)", "7.70 s of the same requests sent one after another",
                branch="queued", not_branch=("computed", "batched"))
    assert_says(lines[2], "5.00 s alone", "18.00 s", "(3.6x)", "4 users",
                branch=("latency rose", "with little more throughput"),
                not_branch=("while throughput rose", "hardly changed"))
    assert not any("SCALES" in line or "batched" in line for line in lines)


def test_task6_insight_counts_failures_and_a_dead_level_prints_dashes():
    dead = level_of(5, 1.0, 0.0, 0.0, failed=5)
    lines = task6.insights([level_of(1, 5.0, 5.0, 0.2), dead], level_of(5, 2.0, 1.0, 0.1, failed=2))
    # 5 of the level of 5 and 2 of the sequential 5 failed: 7 of 1 + 5 + 5 = 11 sent
    assert len(lines) == 2
    assert_says(lines[0], "7 of 11 requests", branch="FAILED")
    # the largest level has no request that succeeded: no figure to compare
    assert_says(lines[1], "1, 5 user(s)", branch="Nothing to compare",
                not_branch=("SCALES", "barely grew"))
    assert task6.fmt.secs(dead.mean_latency_s) == "-"
    assert dead.mean_latency_s is None and dead.num_failed == 5 and dead.num_ok == 0
    # saved as measured: nothing measured is left out, and it reads back the same
    assert "mean_latency_s" not in dead.to_dict() and dead.to_dict()["errors"] == ["boom"]
    assert LoadLevel.from_dict(dead.to_dict()) == dead
    # nothing failed: no line counts failures
    levels = [level_of(1, 5.0, 5.0, 0.2), level_of(4, 8.0, 7.0, 0.3)]
    assert not any("FAILED" in line for line in task6.insights(levels, None))


def test_task6_scaling_factor_and_per_user_speed_by_hand(capsys):
    # 1 user: 50 tokens in 5.0 s = 10.0 tok/s; 4 users: 200 tokens in 8.0 s = 25.0 tok/s;
    # 20 users: 1,000 tokens in 12.5 s = 80.0 tok/s. Peak / first = 80 / 10 = 8.0x.
    # Per user: 10.0, 25 / 4 = 6.25, 80 / 20 = 4.0 tok/s; TPOT (5.0 - 0.2) / 49 = 98 ms.
    levels = [level_of(1, 5.0, 5.0, 0.2), level_of(4, 8.0, 7.0, 0.3), level_of(20, 12.5, 11.0, 0.5)]
    assert task6.print_scaling(levels) == 8.0
    out = capsys.readouterr().out
    factor = next(line for line in out.splitlines() if line.startswith("Scaling factor:"))
    assert_says(factor, "8.0x")
    # TPOT 98.0, (7.0 - 0.3) / 49 = 136.7, (11.0 - 0.5) / 49 = 214.3 ms; no /metrics: '-'
    assert "\n      1        10.0       98.0                 -\n" in out
    assert "\n      4         6.2      136.7                 -\n" in out   # 6.25 to one place
    assert "\n     20         4.0      214.3                 -\n" in out
    levels[2].engine_itl_s = 0.2                          # the engine core's own, read
    task6.print_scaling(levels)
    assert "\n     20         4.0      214.3             200.0\n" in capsys.readouterr().out
    assert task6.print_scaling([level_of(1, 5.0, 0.0, 0.0, failed=1), levels[2]]) == 0.0


def sequential_of(users: int, latency_s: float, tokens: int = 50) -> LoadLevel:
    """users requests one after another, each alone: latency_s each, TTFT 0.2 s, the k-th sent
    at k x latency_s."""
    requests = [RequestResult(True, tokens, 10, 0.2, latency_s, start_s=k * latency_s)
                for k in range(users)]
    return LoadLevel.of(requests, users * latency_s, is_concurrent=False)


def test_task6_one_request_alone_is_checked_two_ways(capsys):
    # The source's story of a 1-user level measured once as an outlier: its passes made 50
    # tokens in 10.0, 9.0 and 10.5 s (5.0, 5.6, 4.8 tok/s; median 5.0), where 20 requests one
    # after another took 5.0 s each (10.0 tok/s): 4.8-5.6 and 10.0-10.0 do not overlap. The
    # baseline is the sequential requests (20 passes against 3): 80 / 10 = 8.0x, not 16.0x
    one_user = [level_of(1, 10.0, 10.0, 0.2), level_of(1, 9.0, 9.0, 0.2),
                level_of(1, 10.5, 10.5, 0.2)]
    twenty = level_of(20, 12.5, 6.0, 0.5)                                  # 1,000 / 12.5 = 80.0
    seq = sequential_of(20, 5.0)
    alone = record6.alone_of(one_user, seq)
    assert not alone.agree and alone.used == SEQUENTIAL
    assert (alone.level.median, alone.level.low, alone.level.high) == (5.0, 50 / 10.5, 50 / 9.0)
    assert (alone.tokens_per_s, alone.latency_s) == (10.0, 5.0)
    levels = [one_user[0], twenty]
    spreads = [alone.level, Spread.of([76.0, 80.0, 84.0])]
    assert task6.print_scaling(levels, spreads, alone, seq) == 8.0
    out = " ".join(capsys.readouterr().out.split())
    assert_says(out, "the 1-user level: 5.0 (4.8-5.6, 3 passes)",
                "the 20 requests one after another: 10.0 (10.0-10.0, 20 requests)",
                "5.0 against 10.0 tok/s: they DISAGREE, 2.00x apart",
                "the sequential requests, the one of more passes (20 against 3)",
                "10.0 tok/s", "8.0x",
                "(7.6-8.4 from the spreads)",                              # 76 / 10, 84 / 10
                not_branch=("they agree", "as they agree"))
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
    steady = [level_of(1, 5.0, 5.0, 0.2), level_of(1, 5.2, 5.2, 0.2), level_of(1, 4.9, 4.9, 0.2)]
    steady_seq = sequential_of(20, 5.1)                            # 50 / 5.1 = 9.8 tok/s
    alone = record6.alone_of(steady, steady_seq)
    assert alone.agree and alone.used == LEVEL
    assert (alone.tokens_per_s, alone.latency_s) == (10.0, 5.0)
    assert task6.print_scaling([steady[0], twenty], spreads, alone, steady_seq) == 8.0
    out = " ".join(capsys.readouterr().out.split())
    assert_says(out, "the 1-user level", "10.0 against 9.8 tok/s: they agree",
                "The baseline is the 1-user level, as they agree", not_branch="DISAGREE")
    # no sequential requests (--no-sequential): the level alone, nothing to check it against
    alone = record6.alone_of(one_user, None)
    assert alone.agree and alone.used == LEVEL and alone.sequential is None


def test_task6_twins_whose_ranges_touch_but_medians_differ_disagree(capsys):
    # issue 48's run: the 1-user level 46.6 tok/s (37.4-48.7, 3 passes), the 20 sequential
    # requests 38.6 each. The ranges touch (37.4 <= 38.6), but 46.6 / 38.6 = 1.21x, over
    # measure.AGREE_WITHIN (10%): they DISAGREE, and the baseline is the sequential requests
    # (20 passes against 3), so the factor divides by 38.6: 323.5 / 38.6 = 8.4x, not 6.9x
    one_user = [level_of(1, 50 / t, 50 / t, 0.04) for t in (48.7, 46.6, 37.4)]
    seq = sequential_of(20, 50 / 38.6)
    alone = record6.alone_of(one_user, seq)
    assert alone.level.low < alone.sequential.high                 # the ranges touch
    assert not alone.agree and alone.used == SEQUENTIAL
    assert alone.tokens_per_s == pytest.approx(38.6)
    twenty = level_of(20, 1000 / 323.5, 3.0, 0.2)
    spreads = [alone.level, Spread(323.5, 300.0, 330.0, 3)]
    scaling = task6.print_scaling([one_user[1], twenty], spreads, alone, seq)
    assert scaling == pytest.approx(323.5 / 38.6)
    out = " ".join(capsys.readouterr().out.split())
    assert_says(out, "46.6 against 38.6 tok/s: they DISAGREE, 1.21x apart",
                "The baseline is the sequential requests", "38.6 tok/s (the sequential requests)",
                "8.4x throughput improvement", not_branch=("they agree", "6.9x"))


def test_task6_levels_take_turns_and_keep_their_median_pass():
    passes = [[level_of(1, 10.0, 10.0, 0.2), level_of(1, 5.0, 5.0, 0.2),
               level_of(1, 6.0, 6.0, 0.2)],
              [level_of(4, 8.0, 7.0, 0.3), level_of(4, 9.0, 8.0, 0.3), level_of(4, 7.0, 6.0, 0.3)]]
    # tok/s 5.0, 10.0, 8.3: the median pass is the third; 25.0, 22.2, 28.6: the first
    assert load.median_passes(passes) == [passes[0][2], passes[1][0]]


def test_task2_speedup_by_hand(capsys):
    # vLLM: 50 tokens in 2.0 s = 25.0 tok/s; HuggingFace: 12.5 tok/s (4.0 s): 25 / 12.5 = 2.0x
    gen = engine.Generation("vLLM", "text", 11, 50, 2.0, 9.0, 2)
    saved = engine.OneRequest.of(gen, engine.Sampling("p", 50, 0.7, 42), results.RunHeader())
    assert gen.tokens_per_s == 25.0 and saved.tokens_per_s == 25.0
    eng = engine.Engine(None, 9.0, {})
    speedup = task2.print_results(gen, eng, Baseline("measured now", 12.5, 4.0))
    assert speedup == 2.0
    out = capsys.readouterr().out
    assert "vLLM made 2.0x HuggingFace's tokens/sec" in out
    assert re.search(r"\nTokens/sec +12\.5 +25\.0\n", out)
    # the other way round: 12.5 against 25.0 is 0.5x, "as fast" is not claimed as faster
    task2.print_results(engine.Generation("vLLM", "", 11, 50, 4.0, 9.0, 2), eng,
                        Baseline("measured now", 25.0, 2.0))
    assert "vLLM made 0.5x HuggingFace's tokens/sec" in capsys.readouterr().out


def test_task2_one_request_is_told_apart_only_by_its_passes():
    # vLLM's passes 2.0, 2.1, 2.2 s for 50 tokens: 25.0, 23.8, 22.7 tok/s (median 23.8)
    gen = engine.Generation("vLLM", "text", 11, 50, 2.1, 9.0, 2, pass_times_s=[2.0, 2.1, 2.2])
    near = Baseline("task 1", 23.0, 2.17, [22.0, 23.0, 24.0])          # overlaps
    assert_says(task2.one_request_line(gen, near), "vLLM 23.8", "HuggingFace 23.0",
                branch="within each other's passes: not told apart",
                not_branch=("faster", "slower", "one pass"))
    far = Baseline("task 1", 15.0, 3.33, [14.0, 15.0, 16.0])           # 23.8 / 15.0
    assert_says(task2.one_request_line(gen, far), "vLLM 23.8", "HuggingFace 15.0", "1.59x",
                branch=("faster beyond the passes", "this gain is not batching"),
                not_branch=("not told apart", "slower", "one pass"))
    fast = Baseline("task 1", 30.0, 1.67, [29.0, 30.0, 31.0])          # 23.8 / 30.0
    assert_says(task2.one_request_line(gen, fast), "0.79x", branch="slower beyond the passes",
                not_branch=("not told apart", "faster"))
    older = Baseline("task 1", 23.0, 2.17)                             # one pass saved
    assert_says(task2.one_request_line(gen, older), "vLLM 23.8", "HuggingFace 23.0",
                "1.04x",   # 23.81 / 23.0, a ratio but no verdict: one pass
                branch="one pass of a way: not told apart",
                not_branch=("faster", "slower", "within each other's passes"))


def test_task2_key_insight_keeps_its_limits(capsys):
    """Every branch of task 2's insight, with the capacity line, within the lab's limits: at
    most 5 bullets and 12 printed lines, each a whole sentence."""
    gen = engine.Generation("vLLM", "text", 11, 50, 2.1, 9.0, 2, pass_times_s=[2.0, 2.1, 2.2])
    capacity = kv.KVCapacity(num_blocks=364, block_size=16, max_model_len=128)
    assert_says(task2.capacity_line(capacity), "5,824 tokens", "45 whole requests", "128 tokens",
                branch="task 6 puts them to work")     # 364 / 8 = 45.5: 45 whole requests
    for spread in ([22.0, 23.0, 24.0], [14.0, 15.0, 16.0], [29.0, 30.0, 31.0], []):
        baseline = Baseline("task 1", spread[1] if spread else 23.0, 2.0, spread)
        assert_insight_fits(task2.insights(gen, baseline, capacity), capsys)


# --- task 7: the insight from the three configs -----------------------------------------------
def config(label, max_model_len, max_num_seqs, blocks, concurrency, running, waiting, tok_s,
           spread=None):
    # 10 requests of 50 tokens; the duration gives the level its tok/s; spread: (low, high) of
    # 3 passes, None for one pass
    measured = LoadLevel(10, 10, 500 / tok_s, 500, tok_s)
    passes = (task7.measure.Spread(tok_s, *spread, 3) if spread else
              task7.measure.Spread(tok_s, tok_s, tok_s, 1))
    return task7.ConfigRun(task7.TuningConfig(label, max_model_len, max_num_seqs), "started",
                           concurrency, measured, num_kv_blocks=blocks, kv_block_size_tokens=128,
                           peak_num_requests_running=running, peak_num_requests_waiting=waiting,
                           spread=passes)


def test_task7_insight_from_the_configs():
    rows = [config("A: Default", 128, 256, 22, 22.0, 10, 0, 80.0, (76.0, 84.0)),
            config("B: Shorter Context", 64, 256, 22, 22.0, 10, 0, 81.0, (79.0, 83.0)),
            config("C: Limited Concurrency", 64, 8, 22, 22.0, 8, 2, 60.0, (58.0, 63.0))]
    lines = show7.insights(rows, 10)
    assert len(lines) == 4
    # a paged cache: max_model_len reserves no memory, whatever the figures; 128-token blocks:
    # 64 tokens hold ceil(64 / 128) = 1, 128 tokens 1, so B's max concurrency is A's (22x
    # each): the line says why, in whole blocks
    assert_says(lines[0], "In 128-token blocks, 64 and 128 tokens need 1 and 1",
                "22x for B", "22x for A", branch="reserves no KV memory",
                not_branch=("moved only", "sets the KV memory"))
    # A 76.0-84.0 and B 79.0-83.0 overlap: not told apart, whatever the medians
    assert_says(lines[1], "B made 81.0 (79.0-83.0) tok/s", "A's 80.0 (76.0-84.0)",
                branch="cannot be told apart", not_branch=("FASTER", "SLOWER", "one pass"))
    # C: 8 ran and 2 waited at max_num_seqs=8; 58.0-63.0 tok/s lies below B's 79.0-83.0
    assert_says(lines[2], "max_num_seqs=8", "8 ran", "2 waited",
                "C made 60.0 (58.0-63.0) tok/s", "B's 81.0 (79.0-83.0)",
                branch=("caps the batch", "SLOWER than B"),
                not_branch=("capped nothing", "not observed", "cannot be told apart"))
    # C's 22 blocks, B's 22: the same cache
    assert_says(lines[3], "the same 22 blocks as B's", branch="reserves no memory",
                not_branch=("against B's", "cannot say"))
    # the summary row says the same of A, B and C
    tuning = task7.Tuning(num_requests=10, max_tokens=50, kv_cache_memory_bytes=0,
                          configs=rows)
    assert_says(lesson_7.summary_row(tuning), "A 80.0", "B 81.0", "C 60.0",
                "A, B not told apart", "C below B", not_branch=("above", "1 pass"))
    # the other way: A 70.0-74.0 below B's 79.0-83.0, and C 78.0-85.0 overlapping B
    other = [dataclasses.replace(rows[0], level=LoadLevel(10, 10, 500 / 72.0, 500, 72.0),
                                 spread=task7.measure.Spread(72.0, 70.0, 74.0, 3)),
             rows[1],
             dataclasses.replace(rows[2], level=LoadLevel(10, 10, 500 / 80.0, 500, 80.0),
                                 spread=task7.measure.Spread(80.0, 78.0, 85.0, 3))]
    lines = show7.insights(other, 10)
    assert_says(lines[1], "B made 81.0 (79.0-83.0) tok/s", "A's 72.0 (70.0-74.0)",
                branch="FASTER than A", not_branch=("cannot be told apart", "SLOWER"))
    assert_says(lines[2], "C made 80.0 (78.0-85.0) tok/s", "B's 81.0",
                branch=("caps the batch", "B and C cannot be told apart"),
                not_branch=("FASTER", "SLOWER"))
    assert_says(lesson_7.summary_row(dataclasses.replace(tuning, configs=other)), "A 72.0",
                "B 81.0", "C 80.0", "B above A", "B, C not told apart",
                not_branch=("below", "1 pass"))
    # one pass each (lab.py --quick): no spread, so nothing is called apart
    single = [config(r.label, r.config.max_model_len, r.config.max_num_seqs, 22, 22.0,
                     r.peak_num_requests_running, r.peak_num_requests_waiting,
                     r.level.tokens_per_s) for r in rows]
    lines = show7.insights(single, 10)
    assert_says(lines[1], "B made 81.0 tok/s", "A's 80.0", branch="one pass each",
                not_branch=("cannot be told apart", "FASTER", "SLOWER"))
    assert_says(lines[2], "C made 60.0 tok/s", "B's 81.0", branch="one pass each",
                not_branch=("cannot be told apart", "FASTER", "SLOWER"))
    assert_says(lesson_7.summary_row(dataclasses.replace(tuning, configs=single)), "A 80.0",
                "B 81.0", "C 60.0", branch="1 pass: not compared",
                not_branch=("told apart", "above", "below"))
    # C's cache of 11 blocks against B's 22 (another run's memory): named, not "the same"
    other = [*rows[:2], dataclasses.replace(rows[2], num_kv_blocks=11)]
    assert_says(show7.insights(other, 10)[3], "11 blocks", "B's 22",
                branch=("against B's", "cannot say it reserves none"),
                not_branch=("the same 11", "reserves no memory"))
    # an engine that exports no block count: no line about C's memory
    other[2] = dataclasses.replace(rows[2], num_kv_blocks=None)
    assert not any("blocks" in line for line in show7.insights(other, 10)[1:])
    assert len(show7.insights(other, 10)) == 3
    # 16-token blocks: 64 tokens hold 4, 128 hold 8, so B fits twice A; and C saw nothing wait
    rows[1] = dataclasses.replace(rows[1], kv_max_concurrency=44.0)
    rows[2] = dataclasses.replace(rows[2], peak_num_requests_running=6,
                                  peak_num_requests_waiting=0)
    lines = show7.insights(rows, 6)
    assert_says(lines[0], "128 -> 64 moved only the max concurrency, 22x -> 44x",
                branch="reserves no KV memory", not_branch=("-token blocks", "sets the KV memory"))
    assert_says(lines[2], "max_num_seqs=8", "6 of the 6 requests",
                branch="capped nothing", not_branch=("caps the batch", "not observed"))
    # /metrics never answered while C's requests ran (a busy 2-core machine): not observed,
    # never "capped nothing" from a read taken before the load
    rows[2] = dataclasses.replace(rows[2], peak_num_requests_running=0, num_metrics_samples=1)
    assert_says(show7.insights(rows, 10)[2], "max_num_seqs=8", "none of 1 read(s)",
                branch="not observed", not_branch=("capped nothing", "caps the batch"))


# --- task 8: the insight from the snapshot ----------------------------------------------------
def snap(running, waiting, kv_usage):
    """Task 8's Snapshot of a /metrics read with this batch (the insight reads nothing else)."""
    from common import metrics

    read = metrics.Snapshot(0.0, 0.0, running, waiting, kv_usage, 0.0, 0.0, 0.0, 0.0, 0.0)
    return task8.Snapshot.of(read, read)


def test_task8_insight_from_the_snapshot():
    assert_says(show8.insight_lines(snap(0, 0, 0.0), 0.0, 8)[1], "0 requests running",
                branch="idle", not_branch="one batch")
    lines = show8.insight_lines(snap(8, 12, 0.364), 61.04, 8)
    assert len(lines) == 3
    assert lines[0] == show8.PRODUCTION           # whatever the figures: /metrics in production
    # 61.04 tok/s, to one place
    assert_says(lines[1], "8 requests", "61.0 tok/s", branch="one batch")
    # 8 running at max_num_seqs=8 with 12 waiting, the cache 36.4% full (under KV_FULL, 90%)
    assert_says(lines[2], "max_num_seqs=8", "8 ran", "12 waited", "36.4%",
                branch=("capped the batch", "not the memory"),
                not_branch=("the memory capped", "None waited"))
    # 44 running under max_num_seqs=256, 56 waiting, the cache 100% full: the memory
    assert_says(show8.insight_lines(snap(44, 56, 1.0), 260.0, 256)[2], "100.0%", "56 waited",
                branch="the memory capped the batch",
                not_branch=("max_num_seqs=", "None waited"))
    # nothing waiting: all 20 fit, in 45.5% of the cache
    assert_says(show8.insight_lines(snap(20, 0, 0.455), 150.0, 256)[2], "all 20 fit", "45.5%",
                branch="None waited", not_branch="capped")
    # a server that exports no KV usage and no rate: no cache to blame, nothing per second.
    # The line is its two counts and nothing else, so it is compared whole
    lines = show8.insight_lines(snap(3, 2, None), None, None)
    assert_says(lines[1], "3 requests", branch="one batch", not_branch="tok/s")
    assert lines[2] == "2 waited, with 3 running."
    # the same batch, the cache half full: under KV_FULL and max_num_seqs not given, so no limit
    # is named, only the cache's share
    assert_says(show8.insight_lines(snap(3, 2, 0.5), None, None)[2], "2 waited", "3 running",
                "50.0%", not_branch="capped")


# --- task 5: the first request and the two clients ---------------------------------------------
def test_task5_first_request_and_clients_are_judged_by_the_passes():
    later = Spread(1.46, 1.44, 1.50, 3)
    assert_says(task5.first_request_note(9.16, later), "9.16 s", "1.44-1.50 s",
                branch="a warm-up", not_branch="already warm")
    assert_says(task5.first_request_note(1.47, later), "1.47 s", "1.44-1.50 s",
                branch="already warm", not_branch="a warm-up")
    sdk = Spread(1.47, 1.45, 1.52, 3)                       # overlaps 1.44-1.50
    assert_says(task5.clients_line(later, sdk), "1.46 s", "1.47 s", "3 passes",
                branch="adds nothing measurable", not_branch=("apart by", "one pass"))
    slow = Spread(2.19, 2.10, 2.30, 3)                      # 2.19 / 1.46 = 1.50x
    assert_says(task5.clients_line(later, slow), "1.46 s", "2.19 s", "1.50x",
                branch="apart by more than their passes", not_branch="nothing measurable")
    one = Spread(1.46, 1.46, 1.46, 1)
    assert_says(task5.clients_line(one, Spread(1.47, 1.47, 1.47, 1)), "1.46 s", "1.47 s",
                branch="one pass each", not_branch=("nothing measurable", "apart by"))


def test_task5_key_insight_keeps_its_limits(capsys):
    later = Spread(1.46, 1.44, 1.50, 3)
    for sdk in (Spread(1.47, 1.45, 1.52, 3), Spread(2.19, 2.10, 2.30, 3),
                Spread(1.47, 1.47, 1.47, 1)):
        assert_insight_fits(task5.insights(later, sdk), capsys)


def assert_insight_fits(lines: list[str], capsys) -> None:
    """A KEY INSIGHT within the lab's limits (common/report.py): at most MAX_INSIGHT_BULLETS
    bullets and MAX_INSIGHT_LINES printed lines, each bullet a whole sentence (a capital, a full
    stop)."""
    capsys.readouterr()
    report.insight(lines)
    printed = capsys.readouterr().out.splitlines()[2:-1]     # between "KEY INSIGHT:" and the rule
    assert len(lines) <= report.MAX_INSIGHT_BULLETS and len(printed) <= report.MAX_INSIGHT_LINES
    assert all(line[0].isupper() and line.endswith(".") for line in lines), lines
    assert_fits("\n".join(printed))


# --- one way to say a figure (common/fmt.py) and the lab's one tolerance for twins ---------------
def test_twins_agree_by_their_medians_within_the_lab_tolerance_not_their_ranges():
    """46.6 against 38.6 is 1.21x apart, over the 10 % tolerance, although the ranges touch;
    100 against 105 is within it, although the ranges do not."""
    from common import fmt, measure
    a, b = Spread(46.6, 37.4, 48.7, 3), Spread(38.6, 36.0, 40.1, 20)
    assert a.overlaps(b) and not a.agrees(b)
    assert_says(fmt.twins(a, b, "tok/s"), "46.6 against 38.6 tok/s", "1.21x apart",
                branch="DISAGREE", not_branch="agree (")
    c, d = Spread(100.0, 99.0, 101.0, 3), Spread(105.0, 104.0, 106.0, 3)
    assert not c.overlaps(d) and c.agrees(d)
    assert_says(fmt.twins(c, d), "100.0 against 105.0", branch="they agree",
                not_branch="DISAGREE")
    assert measure.within(110.0, 100.0) and not measure.within(110.1, 100.0)
    assert (fmt.times(1.234), fmt.ms(0.0213), fmt.secs(1.5), fmt.pct(0.374)) == \
        ("1.23x", "21.3", "1.50", "37%")
    assert fmt.times_range(Spread(1.65, 1.58, 1.71, 3), "static") == "1.65x static (1.58-1.71)"
    assert fmt.ms(None) == fmt.times(None) == "-"


def test_detail_reaches_the_terminal_only_when_asked(capsys, monkeypatch, tmp_path):
    """Without --detail, what report.detail() holds goes to the file make lab names (the report
    page), not the terminal; with it, to the terminal."""
    from common import cli
    kept = tmp_path / "x.detail.txt"
    monkeypatch.setenv(report.DETAIL_TO, str(kept))
    cli.LabArgumentParser().parse_args([])
    with report.detail():
        print("each pass")
    assert "each pass" not in capsys.readouterr().out and kept.read_text() == "each pass\n"
    cli.LabArgumentParser().parse_args(["--detail"])
    with report.detail():
        print("each pass")
    assert "each pass" in capsys.readouterr().out
    cli.LabArgumentParser().parse_args([])
