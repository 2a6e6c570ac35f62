"""Task 12: its record built by hand (hand_result, from tests/hand/), saved and read back whole,
its figures that follow from others (accepted share, tokens a step, speed-ups), the summary's
row, the insight lines both ways, its figure and its report printed from the record; end to end
on the tiny model (main() with --no-vllm: tokens identical with speculation on and off, every
token counted once in the steps' histogram), and its vLLM part against a tiny-model server given
by --base-url; its bad flags. Its own restart of the lab's server, speculation off then on, is
checked once, on the real model, in the lab's quick run (the last test here). Counts of tokens
and steps are asserted, worked out by hand; never times."""
from __future__ import annotations

import pytest

import task_12_speculative_decoding as task12
from common import figures, fmt, report, results, server, steps
from common.measure import Spread
from lessons.task_12 import FIGURES
from lessons.task_12 import report as task_12_report
from lessons.task_12.figure import NEWLINE, draw_speculation, text_grid
from lessons.task_12.record import EngineRun, SpeculativeDecoding, summary_row
from tests.hand import assert_figure_reads_well
from tests.hand.task_12_speculative_decoding import KS, OUTPUT, SUMMARY_ROW
from tests.hand.task_12_speculative_decoding import record as hand_result
from tests.helpers import assert_fits, assert_says, insight_fits


def test_the_record_reads_back_whole():
    record = hand_result()
    results.save(task12.SCRIPT, record)
    step = steps.by_name()[task12.SCRIPT]
    assert step.record is SpeculativeDecoding and step.figures == FIGURES
    loaded = step.load()
    assert loaded == record
    saved = results.load_raw(task12.SCRIPT, "")
    assert set(saved["mini_engine"][0]) == {
        "workload", "is_concurrent", "num_requests", "k", "duration_s", "num_output_tokens",
        "tokens_per_s", "mean_tpot_s", "num_steps", "num_draft_tokens", "num_accepted_tokens",
        "steps_by_tokens", "num_identical", "pass_tokens_per_s"}   # the outputs are not saved
    assert "texts" not in saved["vllm"][4] and saved["vllm"][4]["num_same_text"] == 2
    # off: no counter of speculation (vLLM exports none), saved as not measured
    assert "num_draft_tokens" not in saved["vllm"][0]
    assert saved["answers"][0]["tokens"][:3] == [" The", " GNU", " General"]
    assert saved["settings"]["ks"] == KS and "base_url" not in saved["settings"]


def test_the_figures_that_follow_from_others():
    record = hand_result()
    k4 = record.engine_run("copy", False, 4)
    # 31 decoding rows verified 4 guesses each: 124; kept 0 x 4 + 1 x 2 + 2 x 2 + 3 x 3 + 4 x 20
    assert (k4.num_draft_tokens, k4.num_accepted_tokens) == (124, 95)
    assert k4.accepted_share == pytest.approx(95 / 124)
    assert k4.tokens_per_step == pytest.approx(126 / 31)      # 4.06 tokens a step
    assert k4.mean_step_s == pytest.approx(1.28 / 33)
    assert record.engine_run("copy", False, 0).tokens_per_step == 1.0
    assert record.engine_run("copy", False, 0).accepted_share is None
    assert record.engine_speedup("copy", False, 4) == pytest.approx(2.5)
    assert record.engine_speedup("chat", True, 8) == pytest.approx(0.75)
    off, on = record.server_runs("copy", False)
    assert (off.k, on.k) == (0, 4)
    assert on.accepted_share == pytest.approx(95 / 124)
    # 128 - 2 first tokens decoded in 126 - 95 steps (vLLM's own mean acceptance length, 1 +
    # accepted / drafts, would count only the steps that guessed)
    assert on.tokens_per_step == pytest.approx(126 / 31)
    assert off.accepted_share is None and off.tokens_per_step is None
    assert record.vllm_speedup("chat", True) == pytest.approx(0.8)


def test_a_speed_up_is_the_median_round_with_its_range():
    record = hand_result()
    # mini_engine, round by round: 2.5 x 0.96 / 1.02, 2.5 x 1 / 1, 2.5 x 1.02 / 0.95
    spread = record.engine_speedup_spread("copy", False, 4)
    assert (spread.median, spread.low, spread.high, spread.num_passes) == pytest.approx(
        (2.5, 2.5 * 0.96 / 1.02, 2.5 * 1.02 / 0.95, 3))
    # vLLM's two servers did not take turns: on's slowest over off's fastest, and the reverse
    spread = record.vllm_speedup_spread("copy", False)
    assert (spread.median, spread.low, spread.high) == pytest.approx(
        (2.5, 2.5 * 0.97 / 1.03, 2.5 * 1.01 / 0.98))
    assert fmt.times_range(spread) == "2.50x (2.35-2.58)"
    # one pass: the one ratio, no range
    for run in record.mini_engine:
        run.pass_tokens_per_s = []
    spread = record.engine_speedup_spread("copy", False, 4)
    assert (spread.median, spread.num_passes) == (2.5, 1) and fmt.times_range(spread) == "2.50x"


def test_the_summary_row():
    record = hand_result()
    # copy alone 100 / 40 (2.35-2.68); vLLM 160 / 64 (2.35-2.58); 16 chats 256 / 320 (0.75-0.86)
    row = "copy 2.5x (2.4-2.7), vLLM 2.5x (2.4-2.6); 16 chat 0.80x (0.75-0.86)"
    assert summary_row(record) == row == SUMMARY_ROW
    assert steps.by_name()[task12.SCRIPT].row(record) == row
    record.vllm = None                                   # --no-vllm
    assert_says(summary_row(record), "copy 2.5x (2.4-2.7)", "16 chat 0.80x (0.75-0.86)",
                not_branch="vLLM")


def test_the_insight_says_what_the_figures_show():
    record = hand_result()
    lines = task_12_report.insights(record)
    assert len(lines) == 5
    insight_fits(lines)
    # fp32 at k = 8: 16/16 copies and 16/16 chats identical
    assert_says(lines[0], "16/16 requests", "k = 8", branch="changed no token",
                not_branch=("a bug", "rounding"))
    # the best k for copy requests one at a time: 4 (2.5x against 2.0x at 2 and 8), vLLM's,
    # its rounds 2.35-2.68, all over 1: a gain. 128 / 33 = 3.88x fewer steps; a step 1.28 s /
    # 33 = 38.8 ms against 3.2 s / 128 = 25 ms: 1.55x as dear, over 1.25x; 3.88 / 1.55 = 2.50
    assert_says(lines[1], "2.50x (2.35-2.68)", "k = 4", "3.88x fewer steps", "1.55x the time",
                branch=("A gain", "outweighed"),
                not_branch=("A loss", "only", "Not told apart"))
    # 16 copies at once: 288 / 320 = 0.90x, rounds 0.85-0.97, all under 1: a loss, though the
    # run took 64 / 17 = 3.76x fewer steps: a step 3.556 s / 17 = 209 ms against 3.2 s / 64 =
    # 50 ms, 4.18x as dear; 3.76 / 4.18 = 0.90
    assert_says(lines[2], "16 copies", "0.90x (0.85-0.97)", "k = 4", "3.76x fewer steps",
                "4.18x the time", branch=("A loss", "did not make up"),
                not_branch=("A gain", "only", "Not told apart"))
    # chat at k = 4: kept 13 of 80 guesses (16%); one at a time 40.8 / 40 = 1.02x, rounds
    # 0.96-1.10 (straddling 1); 16 at once 256 / 320 = 0.80x (0.75-0.86): no gain at either
    assert_says(lines[3], "16%", "1.02x (0.96-1.10) one at a time", "0.80x (0.75-0.86) 16 at once",
                branch="gained nothing")
    # vLLM at k = 4: 160 / 64 = 2.50x (2.35-2.58), 250.2 / 278 = 0.90x (0.85-0.93); chat
    # 60.8 / 64 = 0.95x, 222.4 / 278 = 0.80x; mini_engine's best k is vLLM's: no other figure
    assert_says(lines[4], "k = 4", "2.50x (2.35-2.58) for one copy request",
                "0.90x (0.85-0.93) for 16", "chat 0.95x and 0.80x", not_branch="mini_engine")
    # beside the tables: bf16's 2 of the 3 x (2 + 16) x 2 = 108 requests of part 2 with
    # speculation on that differ (chat, 16, k = 8): fp32 says that is mini_engine's rounding
    assert_says(task_12_report.dtype_line(record), "bfloat16", "2 of", "108 requests",
                branch="rounding", not_branch="fp32 differs")
    # 2 + 16 + 2 + 15 of 36 requests the same text; vLLM never ran in fp32: no cause given
    assert_says(task_12_report.vllm_text_line(record), "1 of 36 requests", "bfloat16",
                branch=("changed", "not checked"), not_branch=("was the same", "rounding"))
    # no vLLM speed-up past what its tokens a step buy; no run's steps fell less than a third
    # short of its tokens a step (16 copies at k = 4: 17 x 4.06 = 69 steps' worth of 64)
    assert task_12_report.unexplained_lines(record) == []
    assert task_12_report.steps_notes(record) == []


def test_the_insight_changes_when_the_figures_do():
    record = hand_result()
    record.correct[1].num_identical = 14                # chat
    for run in record.mini_engine:
        run.num_identical = run.num_requests
    # k = 4 now slower than off, round by round: k = 2 (2.0x) the best
    record.engine_run("copy", False, 4).pass_tokens_per_s = [36.0] * 3
    record.engine_run("copy", False, 2).num_steps = 60  # 1.6 s / 60 = 27 ms: 1.07x off's 25
    record.engine_run("copy", True, 4).num_steps = 60   # the steps barely fell
    for run in record.vllm[4:]:
        run.num_same_text = run.level.num_users
    # vLLM's chat alone 76.8 / 64 = 1.20x, past its 126 / (126 - 4) = 1.03 tokens a step
    record.server_runs("chat", False)[1].level.tokens_per_s = 76.8
    lines = task_12_report.insights(record)
    assert len(lines) == 5
    insight_fits(lines)
    # 16 - 14 = 2 chats differ at k = 8
    assert_says(lines[0], "chat k = 8", "(2 differ)", branch="a bug",
                not_branch=("changed no token", "rounding"))
    # k = 2 (as 8, the first): rounds 76.8 / 40.8, 80 / 40, 81.6 / 38 = 1.88-2.15, a gain; 128
    # / 60 = 2.13x fewer steps, a step 27 ms against 25 (1.07x): nearly free
    assert_says(lines[1], "2.00x (1.88-2.15)", "k = 2", "2.13x fewer steps", "1.07x the time",
                branch=("A gain", "only 1.07x"), not_branch=("outweighed", "A loss"))
    # 16 copies at k = 4: 64 / 60 = 1.07x fewer steps, a step 3.556 s / 60 = 59 ms against 50
    # (1.19x): a loss
    assert_says(lines[2], "1.07x fewer steps", "1.19x the time", branch="A loss",
                not_branch=("A gain", "only"))
    # at vLLM's k = 4, mini_engine's own rounds 36 / 40.8, 36 / 40, 36 / 38: 0.90x; vLLM's chat
    # alone now 1.20x
    assert_says(lines[4], "2.50x (2.35-2.58) for one copy request", "(mini_engine 0.90x)",
                "chat 1.20x and 0.80x")
    # the unexplained part is the chat alone's (1.03 tokens a step), not 16 at once's
    (unexplained,) = task_12_report.unexplained_lines(record)
    assert_says(unexplained, "chat, one at a time", "1.20x", "1.03 tokens",
                branch="not measured")
    # 60 x 4.1 = 244 steps' worth of tokens, over 1.33 x 64: the slowest request
    (steps_note,) = task_12_report.steps_notes(record)
    assert_says(steps_note, "16 copy requests", "k = 4", "64 -> 60 steps", "4.1 tokens",
                branch="slowest request")
    assert_says(task_12_report.vllm_text_line(record), "36/36 requests", branch="was the same",
                not_branch=("changed", "not checked"))
    assert task_12_report.dtype_line(record) is None      # bf16 as off in every request
    # copy alone at k = 2 straddling 1 now: not told apart, whatever its steps
    record.engine_run("copy", False, 2).pass_tokens_per_s = [36.0, 40.0, 46.0]
    record.engine_run("copy", False, 4).pass_tokens_per_s = [30.0] * 3
    record.engine_run("copy", False, 8).pass_tokens_per_s = [30.0] * 3
    # rounds 36 / 40.8, 40 / 40, 46 / 38: 0.88-1.21
    assert_says(task_12_report.insights(record)[1], "1.00x (0.88-1.21)", "k = 2",
                branch="Not told apart", not_branch=("A gain", "A loss"))
    record.vllm = None
    lines = task_12_report.insights(record)
    assert not any("vLLM's ngram" in line or line.startswith("vLLM") for line in lines)
    assert len(lines) == 4
    insight_fits(lines)


@pytest.mark.parametrize("off_ms, on_ms, on_steps, speedup, branch", [
    (15.0, 17.5, 40, Spread(1.5, 1.4, 1.6, 3), "only"),          # 1.17x the step: within 1.25x
    (15.0, 30.0, 40, Spread(1.5, 1.4, 1.6, 3), "outweighed"),    # 2.0x the step, a gain
    (15.0, 30.0, 40, Spread(0.96, 0.96, 0.96, 1), "did not make up"),   # one pass, under 1
    (15.0, 16.0, 40, Spread(0.9, 0.85, 0.97, 3), "did not make up"),    # cheap, yet a loss
    (15.0, 30.0, 40, Spread(1.02, 0.95, 1.1, 3), "and a step"),  # the rounds straddle 1
    (15.0, 30.0, 100, Spread(0.5, 0.5, 0.5, 1), "A loss: no fewer steps"),   # as many steps
    (15.0, 15.5, 100, Spread(0.97, 0.9, 1.05, 3), "off: no fewer steps"),     # straddling 1
    (15.0, 14.0, 100, Spread(1.1, 1.05, 1.2, 3), "no step saved"),     # cheaper steps, a gain
])
def test_what_a_step_cost_chooses_its_sentence(off_ms, on_ms, on_steps, speedup, branch):
    """A step with guesses against a step without, from made-up figures: 100 steps off; the
    verdict is the speed-up's own (under 1 is a loss, whatever a step cost)."""
    def run(ms: float, k: int, steps: int) -> EngineRun:
        return EngineRun("copy", False, 1, k, ms * steps / 1000, 64, 0.0, 0.0, steps, 0, 0,
                         [steps])
    line = task_12_report.step_cost(run(off_ms, 0, 100), run(on_ms, 4, on_steps), speedup)
    others = {"only", "outweighed", "did not make up", "and a step", "A loss: no fewer steps",
              "off: no fewer steps", "no step saved"} - {branch}
    steps = "2.50x fewer steps" if on_steps < 100 else "100 -> 100"
    assert_says(line, steps, f"{fmt.times(on_ms / off_ms)} the time", branch=branch,
                not_branch=tuple(others))


def test_the_report_from_the_record(capsys):
    task_12_report.print_report(hand_result())
    out = capsys.readouterr().out
    assert_fits(out)
    lines = out.splitlines()
    assert len(lines) <= report.MAX_LINES - 30          # what ran and the progress lines besides

    def cells(label: str, after: str, n: int = 4) -> list[str]:
        """The last n cells of the first row with this label after the line holding after."""
        start = next(i for i, line in enumerate(lines) if after in line)
        return next(line for line in lines[start:] if line.startswith(label + " ")).split()[-n:]

    copy_8 = " ".join(out.split()).partition("Copy, k = 8 vs off:")[2]
    assert_says(copy_8, "16/16 requests identical")
    header = lines[next(i for i, line in enumerate(lines) if "2. MEASURED" in line) + 1]
    assert header.split() == ["Speculation", "off", "k=2", "k=4", "k=8"]
    assert cells("  speed-up", "Copy, one at a time") == ["1.00x", "2.00x", "2.50x", "2.00x"]
    assert cells("  guesses accepted", "Copy, one at a time") == ["-", "74%", "77%", "59%"]
    assert cells("  speed-up", "Chat, 16 at once") == ["1.00x", "0.95x", "0.80x", "0.75x"]
    assert cells("  steps", "Copy, 16 at once") == ["64", "27", "17", "12"]
    # 3.2 s / 64, 2.667 / 27, 3.556 / 17, 4.571 / 12
    assert cells("  step (ms)", "Copy, 16 at once") == ["50.0", "98.8", "209.2", "381.0"]
    vllm = next(i for i, line in enumerate(lines) if "3. vLLM" in line)
    assert lines[vllm + 1].split() == ["vLLM", "copy,", "2", "copy,", "16", "chat,", "2",
                                       "chat,", "16"]
    assert cells("Tokens/s, off", "3. vLLM") == ["64.0", "278.0", "64.0", "278.0"]
    assert cells("  speed-up", "3. vLLM") == ["2.50x", "0.90x", "0.95x", "0.80x"]
    assert cells("Guesses accepted", "3. vLLM") == ["77%", "70%", "10%", "10%"]
    # 126 / (126 - 95), 1,008 / (1,008 - 700), 126 / (126 - 4), 1,008 / (1,008 - 64)
    assert cells("Tokens a step", "3. vLLM") == ["4.06", "3.27", "1.03", "1.07"]
    assert cells("Same greedy text as off", "3. vLLM") == ["2/2", "16/16", "2/2", "15/16"]
    assert cells("Succeeded, off and on", "3. vLLM") == ["4/4", "32/32", "4/4", "32/32"]
    assert "lowest round" not in out and "--detail" in out           # behind --detail
    # the detail: the rounds' range, the time per output token, each request's tokens
    report.show_detail(True)
    try:
        task_12_report.print_report(hand_result())
    finally:
        report.show_detail(False)
    out = capsys.readouterr().out
    lines = out.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if "lowest round" in line) - 2:]
    assert_says(" ".join(out.split()).partition("Copy, k = 8:")[2], "1,024/1,024 tokens",
                "628 of 1,154 guesses kept")
    # the rounds: x 0.96 / 1.02 to x 1.02 / 0.95 of the median's
    assert cells("  speed-up, lowest round", "Copy, one at a time", 3) == ["1.88x", "2.35x",
                                                                            "1.88x"]
    assert cells("  highest round", "Copy, one at a time", 3) == ["2.15x", "2.68x", "2.15x"]
    assert cells("  tokens as off", "Chat, 16 at once", 3) == ["16/16", "16/16", "14/16"]
    assert cells("  tokens/s", "Copy, one at a time") == ["40.0", "80.0", "100.0", "80.0"]
    assert cells("  tokens a step", "Copy, 16 at once") == ["1.00", "2.47", "4.06", "5.73"]
    assert cells("Speed-up, lowest", "3. vLLM") == ["2.35x", "0.85x", "0.89x", "0.75x"]
    assert cells("  highest", "Speed-up, lowest") == ["2.58x", "0.93x", "0.98x", "0.82x"]
    assert "--detail" not in out


def test_the_answer_is_laid_out_as_it_reads():
    # 10 columns: "ab" and " cde" fit a line (6), " fghij" would pass 10: the next line; a
    # line break ends its line; an empty token takes no room
    assert text_grid(["ab", " cde", " fghij", "x\n", "", "y"], columns=10) == [
        (0, 0, "ab"), (0, 2, " cde"), (1, 0, " fghij"), (1, 6, "x" + NEWLINE), (2, 0, ""),
        (2, 0, "y")]
    assert text_grid(["a" * 12, "b"], columns=10) == [(0, 0, "a" * 12), (1, 0, "b")]


def test_what_the_figure_plots():
    record = hand_result()
    results.save(task12.SCRIPT, record)
    fig = draw_speculation(record)
    copy_text, per_step, chat_text, speed = fig.axes[:4]
    # every token a text on the colour of how it came: 64 - 12 x 4 - 2 = 14 of the model's own
    colours = [t.get_bbox_patch().get_facecolor() for t in copy_text.texts]
    assert len(copy_text.texts) == OUTPUT and not copy_text.axison
    assert sum(c == colours[0] for c in colours) == 14
    assert_says(copy_text.get_title(loc="left"), "copy", "alone", "k = 4", "50 of 64 tokens")
    assert "\u21b5" in " ".join(t.get_text() for t in chat_text.texts)
    # the tokens a step at k = 4, one at a time: copy [4, 2, 2, 3, 20] of 31 rows, then chat
    heights = [round(p.get_height(), 3) for p in per_step.patches]
    assert heights[:5] == [round(100 * n / 31, 3) for n in (4, 2, 2, 3, 20)]
    assert heights[5:] == [round(100 * n / 113, 3) for n in (104, 6, 2, 1, 0)]
    assert per_step.get_ylabel() == "decoding steps (%)"
    # the speed-ups: mini_engine at k = 2, 4, 8, then vLLM, each over copy / chat, 1 / 16
    bars = [round(p.get_height(), 3) for p in speed.patches]
    assert bars[:4] == [2.0, 1.2, 1.05, 0.95] and bars[12:] == [2.5, 0.9, 0.95, 0.8]
    assert [t.get_text() for t in speed.get_legend().get_texts()] == [
        "mini_engine k=2", "mini_engine k=4", "mini_engine k=8", "vLLM k=4"]
    assert_figure_reads_well(fig, steps.by_name()[task12.SCRIPT].load(), "task 12")
    figures.plt().close(fig)
    record.vllm = None
    fig = draw_speculation(record)
    assert len(fig.axes[3].patches) == 12               # no vLLM bars
    figures.plt().close(fig)
    drawn = figures.draw(task12.SCRIPT, record, FIGURES)
    assert [(path.name, why) for path, why in drawn] == [(f"{task12.SCRIPT}.png", None)]


def totals_hold(res: SpeculativeDecoding) -> None:
    """Every run: every decoded token counted once in the histogram (each request's first
    comes from its prompt), the guesses kept within those verified, none without speculation."""
    s = res.settings
    for run in res.mini_engine:
        by = run.steps_by_tokens
        assert len(by) == run.k + 1, (run.workload, run.k)
        assert sum((i + 1) * n for i, n in enumerate(by)) == run.num_requests * (
            s.output_tokens - 1)
        assert run.num_accepted_tokens == sum(i * n for i, n in enumerate(by))
        assert run.num_accepted_tokens <= run.num_draft_tokens <= run.k * sum(by)
        assert run.num_output_tokens == run.num_requests * s.output_tokens


def test_task_12_on_the_tiny_model(tiny_model, capsys):
    """main() itself, --no-vllm: 3 requests of each workload, 8 tokens each, at k = 2 and 3,
    two rounds in turns."""
    record = task12.main(["--model", tiny_model, "--dtype", "float32", "--no-vllm", "--k", "2,3",
                          "--requests", "3", "--output", "8", "--passes", "2"])
    out = capsys.readouterr().out
    assert_fits(out)
    # fp32 at the largest k: every request identical to speculation off, every token
    assert [(c.workload, c.k, c.num_requests, c.num_identical, c.num_tokens,
             c.num_tokens_identical) for c in record.correct] == [
        ("copy", 3, 3, 3, 24, 24), ("chat", 3, 3, 3, 24, 24)]
    assert all(0 < c.num_accepted_tokens <= c.num_draft_tokens for c in record.correct)
    # and fp32 in part 2 too: every run's tokens those of speculation off
    assert all(r.num_identical == r.num_requests for r in record.mini_engine)
    s = record.settings
    assert (s.ks, s.vllm_k, s.num_sequential, s.max_model_len) == ([2, 3], 3, 2, 256)
    assert [(r.workload, r.is_concurrent, r.num_requests, r.k) for r in record.mini_engine] == [
        (name, c, 3 if c else 2, k) for name in ("copy", "chat") for c in (False, True)
        for k in (0, 2, 3)]
    totals_hold(record)
    # every run's two timed rounds kept, the median's (the lower of two) the run's own
    assert record.settings.num_passes == 2 and "took turns, 2 rounds" in " ".join(out.split())
    assert all(len(r.pass_tokens_per_s) == 2 and r.tokens_per_s == min(r.pass_tokens_per_s)
               for r in record.mini_engine)
    assert [(a.workload, a.k, len(a.tokens), len(a.is_guess)) for a in record.answers] == [
        ("copy", 3, 8, 8), ("chat", 3, 8, 8)]
    assert record.answers[0].is_guess[0] is False      # the first token is from the prompt
    assert record.vllm is None and "3. vLLM" not in out
    res = steps.by_name()[task12.SCRIPT].load()
    assert res == record
    assert "vLLM" not in summary_row(res)
    assert "task_12_speculative_decoding.png" in out and "not drawn" not in out


@pytest.mark.engine
@pytest.mark.xdist_group("speculating_server")
def test_task_12_against_a_server_given_by_base_url(tiny_model, speculating_server, capsys):
    """--base-url: part 3 runs once, at that server's own setting (here vLLM's ngram at k = 3;
    the server task 11's --base-url test shares), and the task neither restarts nor stops it; no
    line of the insight, the summary or the figure compares speculation on and off in vLLM,
    which it did not choose."""
    port = speculating_server.port
    record = task12.main(["--model", tiny_model, "--dtype", "float32", "--k", "2",
                          "--requests", "3", "--output", "8", "--passes", "2",
                          "--base-url", f"http://127.0.0.1:{port}/v1"])
    assert server.running_config(port) == speculating_server   # the same server, untouched
    out = capsys.readouterr().out
    assert_fits(out)
    assert [(r.workload, r.is_concurrent, r.k, r.startup_s) for r in record.vllm] == [
        (name, c, None, None) for name in ("copy", "chat") for c in (False, True)]
    assert all(r.level.num_ok == r.level.num_users and r.num_draft_tokens is not None
               and len(r.pass_tokens_per_s) == 2 for r in record.vllm)   # it speculates
    assert record.settings.base_url == f"http://127.0.0.1:{port}/v1"
    assert "for vLLM, at its own setting" in " ".join(out.split())
    assert "Tokens/s (its own)" in out and "Starting vLLM server" not in out
    assert not any("vLLM's ngram" in line or line.startswith("vLLM")
                   for line in task_12_report.insights(record))
    assert "vLLM" not in summary_row(record)
    fig = draw_speculation(record)
    assert len(fig.axes[3].get_legend().get_texts()) == 1     # mini_engine's k only
    figures.plt().close(fig)


@pytest.mark.parametrize("args, message", [
    (["--k", "0"], "'0' must be greater than 0"),
    (["--k", "2,4,8,16,32"], "--k: at most 4 values, not 5"),
    (["--k", "4,4"], "--k 4,4 gives a value twice"),
    (["--ngram", "4,2"], "'4,2': MIN is larger than MAX"),
    (["--ngram", "3"], "'3' is not MIN,MAX (two numbers)"),
    (["--ngram", "0,4"], "'0' must be greater than 0"),
    (["--requests", "x"], "'x' is not a whole number"),
    (["--passes", "0"], "'0' must be greater than 0"),
    (["--output", "1"], "--output 1 leaves nothing to guess"),
    (["--port", "70000"], "'70000' is not a port"),
    (["--base-url", "http://127.0.0.1:1", "--no-vllm"], "--base-url runs part 3"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        task12.parse_args(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and message in lines[0]


def test_quick_is_a_shorthand_that_flags_given_override():
    args = task12.parse_args(["--quick"])
    assert (args.k, args.requests, args.output, args.passes) == ([4], 3, 16, 1)
    args = task12.parse_args(["--quick", "--requests", "6", "--passes", "2"])
    assert (args.k, args.requests, args.output, args.passes) == ([4], 6, 16, 2)
    args = task12.parse_args([])
    assert (args.k, args.requests, args.output, args.ngram, args.passes) == (
        [2, 4, 8], 16, 64, (2, 4), 3)


def test_a_workload_that_cannot_fit_is_one_line(tiny_model, capsys):
    """The tiny model's 256 tokens cannot hold a copy prompt (about 160) and 200 tokens; the
    text's 6,935 tokens hold 57 windows of 120, not 60."""
    for args, message in ((["--output", "200"], "exceed max_model_len 256: lower --output"),
                          (["--requests", "60"], "--requests 60 copy windows of 120 tokens are "
                                                 "more than the")):
        with pytest.raises(SystemExit) as exit_:
            task12.main(["--model", tiny_model, "--no-vllm", *args])
        lines = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(lines) == 1 and message in lines[0], lines


@pytest.mark.lab_steps("task_12_speculative_decoding")
def test_task_12_on_the_real_model_guesses_and_changes_no_token(lab_run):
    # task 12 (--quick: k = 4, 3 requests, 16 tokens an answer): in fp32 every request of
    # both workloads identical with speculation on and off, token for token, with guesses
    # kept; every decoded token counted once in the steps' histogram (15 of each answer's
    # 16: its first comes from its prompt); vLLM's server off, then on with its ngram: every
    # request answered, its speculation counters read from /metrics only when on
    assert lab_run.args("task_12_speculative_decoding") == ["--port", str(lab_run.port),
                                                            "--quick"]
    t12 = lab_run.saved("task_12_speculative_decoding")
    assert t12["settings"]["ks"] == [4] and t12["settings"]["vllm_k"] == 4
    assert [(c["workload"], c["k"], c["num_identical"], c["num_tokens_identical"])
            for c in t12["correct"]] == [("copy", 4, 3, 48), ("chat", 4, 3, 48)]
    assert t12["correct"][0]["num_accepted_tokens"] > 0
    runs = t12["mini_engine"]
    assert [(r["workload"], r["is_concurrent"], r["num_requests"], r["k"]) for r in runs] == [
        (name, c, 3 if c else 2, k) for name in ("copy", "chat") for c in (False, True)
        for k in (0, 4)]
    for r in runs:
        assert sum((i + 1) * n for i, n in enumerate(r["steps_by_tokens"])) == \
            r["num_requests"] * 15
        assert r["num_accepted_tokens"] == sum(i * n for i, n in
                                               enumerate(r["steps_by_tokens"]))
    assert [len(a["tokens"]) for a in t12["answers"]] == [16, 16]
    vllm = t12["vllm"]
    assert [(r["k"], r["level"]["num_ok"]) for r in vllm] == [
        (0, 2), (0, 3), (0, 2), (0, 3), (4, 2), (4, 3), (4, 2), (4, 3)]
    assert all("num_draft_tokens" not in r for r in vllm[:4])
    assert all(0 <= r["num_accepted_tokens"] <= r["num_draft_tokens"] for r in vllm[4:])
    assert vllm[4]["num_accepted_tokens"] > 0                # the copy workload's guesses
    # it started the server twice (off, then restarted with the ngram method: the settings
    # differ) and compared every greedy text on with off
    assert vllm[0]["startup_s"] and vllm[4]["startup_s"]
    assert all(0 <= r["num_same_text"] <= r["level"]["num_users"] for r in vllm[4:])
