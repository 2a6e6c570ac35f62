"""Task 11: its record built by hand (hand_result, from tests/hand/), saved and read back whole, the
summary's row, the insight lines both ways, its figure and its report printed from the record;
end to end on the tiny model (main() with --no-vllm: tokens identical at every budget, no step
over its budget, the steps' tokens adding up), and its vLLM part against a tiny-model server
given by --base-url; its bad flags. Its own restarts of the lab's server (without chunking, then
at a budget) are checked once, on the real model, in the lab's quick run (the last test here).
Counts of tokens and steps are asserted, worked out by hand; never times."""
from __future__ import annotations

import pytest

import task_11_chunked_prefill as task11
from common import figures, report, results, server, steps
from common.measure import Spread
from lessons.task_11 import FIGURES
from lessons.task_11 import report as task_11_report
from lessons.task_11.figure import draw_chunking
from lessons.task_11.load import iteration_tokens, prefill_steps, tokens_at_arrival
from lessons.task_11.record import ChunkedPrefill, Correctness, IterationTokens, summary_row
from lessons.task_11.workloads import make_workload
from tests.hand import assert_figure_reads_well
from tests.hand.task_11_chunked_prefill import (BUDGETS, SUMMARY_ROW, hand_latency,
                                                hand_server)
from tests.hand.task_11_chunked_prefill import record as hand_result
from tests.helpers import assert_fits, assert_says, insight_fits


def test_the_record_reads_back_whole():
    record = hand_result()
    results.save(task11.SCRIPT, record)
    step = steps.by_name()[task11.SCRIPT]
    assert step.record is ChunkedPrefill and step.figures == FIGURES
    loaded = step.load()
    assert loaded == record
    assert loaded.vllm[4].steps.steps_by_bucket == {8: 62, 64: 0, 2048: 3}   # int keys
    assert loaded.smallest.label == "budget 64"
    saved = results.load_raw(task11.SCRIPT, "")
    labels = ["no chunking", "budget 512", "budget 256", "budget 128", "budget 64"]
    assert [r["label"] for r in saved["mini_engine"]] == labels
    assert [r["label"] for r in saved["vllm"]] == labels
    assert set(saved["mini_engine"][0]) == {
        "label", "budget_tokens", "is_chunked", "latency", "duration_s", "tokens_per_s",
        "num_steps", "max_step_tokens", "timeline", "passes"}   # the outputs are not saved
    assert set(saved["vllm"][0]) == {"label", "budget_tokens", "is_chunked", "level", "latency",
                                     "steps", "num_prefill_steps", "num_chat_tokens_at_arrival",
                                     "startup_s", "passes"}
    # the passes of no chunking and the smallest budget; the budgets between ran once
    assert [("passes" in r) for r in saved["vllm"]] == [True, False, False, False, True]
    assert saved["mini_engine"][0]["timeline"]["prefill_tokens"][:3] == [160, 1234, 1234]
    assert saved["settings"]["budgets_tokens"] == BUDGETS and "base_url" not in saved["settings"]


def test_the_summary_row():
    record = hand_result()
    # both sides of each trade: 157 / 1,165; 1.70 / 1.21; vLLM's 63 / 700; 1.40 / 0.95
    row = "stall -87%, TTFT +40% (vLLM stall -91%, TTFT +47%)"
    assert summary_row(record) == row == SUMMARY_ROW
    assert steps.by_name()[task11.SCRIPT].row(record) == row
    # vLLM's documents sooner when chunked: 0.55 s (0.50-0.60) against 0.95 (0.90-1.05), -42%
    record.vllm[4].passes.mean_long_ttft_s = Spread(0.55, 0.50, 0.60, 3)
    assert_says(summary_row(record), "stall -87%", "TTFT +40%", "vLLM stall -91%", "TTFT -42%",
                not_branch="not told apart")
    # 0.98 s (0.92-1.10) against 0.95 (0.90-1.05): the spreads overlap, no change is claimed
    record.vllm[4].passes.mean_long_ttft_s = Spread(0.98, 0.92, 1.10, 3)
    assert_says(summary_row(record), "stall -87%", "TTFT +40%", "vLLM stall -91%",
                "TTFT not told apart", not_branch="TTFT +3%")               # 0.98 / 0.95
    # one pass of each: the percentages of the two runs, as measured, never "not told apart"
    for run in [*record.mini_engine, *record.vllm]:
        run.passes = None
    assert_says(summary_row(record), "stall -87%", "TTFT +40%", "vLLM stall -91%", "TTFT +47%",
                not_branch="not told apart")
    record.vllm = None                                   # --no-vllm
    assert summary_row(record) == "stall -87%, TTFT +40%"
    record.vllm = [hand_server(None)]                    # no chunked vLLM run: no figure of it
    assert summary_row(record) == "stall -87%, TTFT +40%"


def test_the_insight_says_what_the_figures_show():
    lines = task_11_report.insights(hand_result())
    assert len(lines) == 5
    insight_fits(lines)
    # fp32: 6 of 6 identical at each of the 4 budgets
    assert_says(lines[0], "6/6 requests", "every budget", branch="changed no token",
                not_branch=("a bug", "rounding"))
    # the chats' longest stall 1,165 ms without chunking, 157 at budget 64: 1,165 / 157 = 7.4x
    # shorter; the documents' TTFT (1.0 + 1.42) / 2 = 1.21 s, (1.4 + 2.0) / 2 = 1.70: 1.40x;
    # each the median of 3 passes, the passes' spreads apart (1,100-1,250 and 150-170 ms,
    # 1.15-1.30 and 1.60-1.80 s: part 2's detail)
    assert_says(lines[1], "mini_engine", "64 tokens", "1,165 -> 157 ms", "(7.4x shorter)",
                "1.21 -> 1.70 s", "(1.40x)",
                branch=("cut the chats' longest stall", "cost the long documents' TTFT"),
                not_branch=("did not shorten", "no TTFT", "not told apart"))
    # without chunking a step held a whole document's 1,234 prompt tokens + 4 chats' decodes:
    # 1,238; no chunked run's step passed its budget
    assert_says(lines[2], "1,238 tokens", branch="no step passed its budget",
                not_branch="a bug")
    # vLLM: stall 700 -> 63 ms, 700 / 63 = 11.1x; TTFT (0.9 + 1.0) / 2 = 0.95 s, (1.2 + 1.6) /
    # 2 = 1.40 s: 1.47x
    assert_says(lines[3], "vLLM", "64 tokens", "700 -> 63 ms", "(11.1x shorter)",
                "0.95 -> 1.40 s", "(1.47x)",
                branch=("cut the chats' longest stall", "cost the long documents' TTFT"),
                not_branch=("did not shorten", "no TTFT", "not told apart"))
    # 2,468 prompt tokens in 42 steps: 59 a step
    assert_says(lines[4], "42 steps", "budget 64", "(2 without chunking)", "59 prompt tokens",
                branch="within the budget", not_branch="over the budget")
    # bfloat16: 6, 5, 6, 4 of 6 matched no chunking, so 4-6; fp32 matched all: rounding
    record = hand_result()
    assert_says(task_11_report.dtype_line(record), "bfloat16", "4-6 of 6",
                branch="rounding", not_branch="fp32 differs")
    record.num_identical_in_dtype = [5, 5, 5, 5]        # the same at every budget: one figure
    assert_says(task_11_report.dtype_line(record), "bfloat16", "5 of 6",
                branch="rounding", not_branch="5-5")
    record.correct.num_identical = [6, 6, 5, 6]         # fp32 differs too: no rounding claimed
    assert_says(task_11_report.dtype_line(record), "5 of 6", branch="fp32 differs too",
                not_branch="rounding")
    record.num_identical_in_dtype = [6, 6, 6, 6]        # bfloat16 as no chunking: nothing to say
    assert task_11_report.dtype_line(record) is None
    assert not any("rounding" in line for line in task_11_report.insights(record))
    assert len(task_11_report.insights(record)) == 5


def test_the_insight_changes_when_the_figures_do():
    record = hand_result()
    small = record.smallest
    small.latency = hand_latency(1300, (0.9, 1.1))      # a longer stall, a shorter TTFT
    small.passes = record.mini_engine[0].passes = None  # one pass each: the runs' own figures
    small.max_step_tokens = 80                          # over its budget of 64
    record.correct.num_identical = [6, 6, 5, 6]
    record.num_identical_in_dtype = [6, 6, 6, 6]
    record.vllm[4].num_prefill_steps = 20               # 2,468 / 20 = 123 a step > 64
    lines = task_11_report.insights(record)
    assert len(lines) == 5
    insight_fits(lines)
    # budget 128 (the third): 5 of 6 identical in fp32, 1 differs
    assert_says(lines[0], "budget 128", "(1 differ)", branch="a bug",
                not_branch=("changed no token", "rounding"))
    # the stall 1,165 -> 1,300 ms, longer; the TTFT 1.21 -> (0.9 + 1.1) / 2 = 1.00 s, shorter
    assert_says(lines[1], "mini_engine", "64 tokens", "1,165 -> 1,300 ms", "1.21 -> 1.00 s",
                branch=("did not shorten", "no TTFT"),
                not_branch=("cut the chats' longest stall", "x shorter", "documents' TTFT"))
    assert_says(lines[2], "budget 64", branch="a bug", not_branch="no step passed")
    assert not any("rounding" in line for line in lines)
    assert_says(lines[4], "20 steps", "123 prompt tokens", branch="over the budget",
                not_branch="within the budget")
    record.vllm = None
    assert not any(line.startswith("vLLM") for line in task_11_report.insights(record))


def test_a_change_the_passes_cannot_tell_apart_is_not_claimed():
    """The stall and the TTFT of budget 64 within the spreads of no chunking's passes: the
    insight and the summary row say so, and claim neither a cut nor a cost."""
    record = hand_result()
    small = record.smallest
    small.passes.max_itl_s = Spread(1.2, 1.15, 1.3, 3)            # 1,100-1,250 overlaps
    small.passes.mean_long_ttft_s = Spread(1.25, 1.2, 1.35, 3)    # 1.15-1.30 overlaps
    line = task_11_report.insights(record)[1]
    insight_fits(task_11_report.insights(record))
    assert_says(line, "mini_engine", "64 tokens", "1,165 -> 1,200 ms", "1.21 -> 1.25 s",
                branch="neither the chats' longest stall",
                not_branch=("cut the chats' longest stall", "did not shorten", "x shorter",
                            "cost the long documents"))
    assert_says(summary_row(record), "stall not told apart", "TTFT not told apart",
                "vLLM stall -91%", "TTFT +47%",
                not_branch=("stall +3%", "TTFT +3%"))          # 1.2 / 1.165, 1.25 / 1.21: +3%
    # one side apart: the stall's spreads overlap, the TTFT's do not (1.60-1.80 against
    # 1.15-1.30 s): two sentences, each its own verdict
    small.passes.mean_long_ttft_s = Spread(1.70, 1.6, 1.8, 3)
    line = task_11_report.insights(record)[1]
    assert_says(line, "(1,165 -> 1,200 ms) was not told apart from no chunking",
                "cost the long documents' TTFT 1.21 -> 1.70 s",
                not_branch=("neither", "TTFT was not told apart"))
    # and the other way about: the stall cut (150-170 ms), the TTFT's spreads overlapping
    small.passes.max_itl_s = Spread(0.157, 0.15, 0.17, 3)
    small.passes.mean_long_ttft_s = Spread(1.25, 1.2, 1.35, 3)
    line = task_11_report.insights(record)[1]
    assert_says(line, "cut the chats' longest stall 1,165 -> 157 ms",
                "TTFT was not told apart (1.21 -> 1.25 s)", not_branch="neither")
    insight_fits(task_11_report.insights(record))


def test_the_report_from_the_record(capsys):
    task_11_report.print_report(hand_result())
    out = capsys.readouterr().out
    assert_fits(out)
    lines = out.splitlines()
    assert len(lines) <= report.MAX_LINES - 30          # what ran and the progress lines besides

    def cells(label: str, part: str) -> list[str]:
        """The row label's last five cells in the table of this part."""
        start = next(i for i, line in enumerate(lines) if part in line)
        return next(line for line in lines[start:] if line.startswith(label + "  ")).split()[-5:]

    budgets = " ".join(out.split()).partition("Budget 512, 256, 128, 64 vs off:")[2]
    assert_says(budgets, "6/6, 6/6, 6/6, 6/6 identical")
    for part in ("2. MEASURED", "3. vLLM"):
        header = lines[next(i for i, line in enumerate(lines) if part in line) + 1]
        assert header.split()[-5:] == ["off", "512", "256", "128", "64"], header
        assert cells("  longest stall (ms)", part)[0] == ("1,165" if "2." in part else "700")
    assert cells("Most tokens in a step", "2. MEASURED") == ["1,238", "512", "256", "128", "64"]
    assert cells("  the budget", "2. MEASURED") == ["2,048", "512", "256", "128", "64"]
    assert cells("Long docs: TTFT mean (s)", "2. MEASURED") == ["1.21", "1.27", "1.35", "1.50",
                                                                 "1.70"]
    assert cells("Docs' prefill (steps)", "3. vLLM") == ["2", "5", "10", "20", "42"]
    assert cells("  prompt tokens a step", "3. vLLM") == ["1,234", "494", "247", "123", "59"]
    assert cells("Succeeded", "3. vLLM") == ["6/6"] * 5
    assert "Chats' tokens at arrival" not in out and "--detail" in out   # behind --detail
    # the detail: each figure the report left out, and the passes' spreads
    report.show_detail(True)
    try:
        task_11_report.print_report(hand_result())
    finally:
        report.show_detail(False)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert cells("Outputs as no chunking", "2. MEASURED")[-4:] == ["6/6", "5/6", "6/6", "4/6"]
    assert cells("Chats' tokens at arrival", "3. vLLM") == ["8"] * 5
    assert cells("  counted over budget", "3. vLLM") == ["0", "2", "2", "2", "3"]
    flat = " ".join(out.split())
    assert_says(flat, "no chunking: longest stall 1,165 ms (1,100-1,250, 3 passes), TTFT 1.21 s "
                      "(1.15-1.30, 3 passes)",
                "budget 64: longest stall 157 ms (150-170, 3 passes), TTFT 1.70 s (1.60-1.80, "
                "3 passes)",
                "no chunking: longest stall 700 ms (650-760, 3 passes)")
    assert "--detail" not in out


def test_what_the_figure_plots():
    record = hand_result()
    results.save(task11.SCRIPT, record)
    fig = draw_chunking(record)
    (off_steps, off_times), (on_steps, on_times) = fig.axes[0:2], fig.axes[2:4]
    bars = [p.get_height() for p in off_steps.patches]
    timeline = record.mini_engine[0].timeline
    assert bars == timeline.decode_tokens + timeline.prefill_tokens   # decode, then on top
    assert [p.get_y() for p in off_steps.patches][len(timeline.decode_tokens):] == \
        timeline.decode_tokens                                          # prefill stacked on it
    assert [line.get_ydata()[0] for line in off_steps.lines] == [2048]     # the budget line
    assert [line.get_ydata()[0] for line in on_steps.lines] == [64]
    assert on_steps.get_title() == "mini_engine, budget 64: 50 steps"   # 3 + 42 chunks + 5
    assert off_steps.get_title() == "mini_engine, no chunking: 8 steps"
    # a row of ticks per chat, then a row per document, from its arrival to its first token;
    # the ticks drawn over everything else, the documents' wait shaded behind (no line lies
    # over a chat's tick)
    assert len(on_times.lines) == 4 + 2
    assert [list(line.get_ydata()) for line in on_times.lines[4:]] == [[4, 4], [5, 5]]
    assert [list(line.get_xdata()) for line in on_times.lines[4:]] == [[0.05, 0.5],
                                                                       [0.05, 1.0]]
    assert all(line.get_zorder() > on_times.lines[4].get_zorder()
               for line in on_times.lines[:4])
    assert [t.get_text() for t in on_times.get_yticklabels()] == [
        "chat 1", "chat 2", "chat 3", "chat 4", "doc 1", "doc 2"]
    assert len(on_times.collections) == 1 and on_times.collections[0].get_zorder() == 0
    assert on_times.get_title() == "longest stall 157 ms, TTFT 1.70 s"
    # the legend lies in the band above the budget line, covering none of it
    fig.canvas.draw()
    assert off_steps.get_legend().get_window_extent().y0 > \
        off_steps.transData.transform((1, 2048))[1]
    # one colour, one meaning: the documents' first tokens are not drawn in prefill's colour
    from matplotlib.colors import to_hex
    bar_colours = {to_hex(p.get_facecolor()) for p in off_steps.patches}
    assert {to_hex(line.get_color()) for line in on_times.lines[4:]}.isdisjoint(bar_colours)
    assert off_steps.get_ylabel() == "tokens computed" and off_steps.get_xlabel() == "engine step"
    assert off_times.get_xlabel() == "time since the first step (s)"
    assert_figure_reads_well(fig, steps.by_name()[task11.SCRIPT].load(), "task 11")
    assert fig.get_suptitle().startswith("Task 11: mini_engine alone")   # vLLM is not drawn
    figures.plt().close(fig)
    drawn = figures.draw(task11.SCRIPT, record, FIGURES)
    assert [(path.name, why) for path, why in drawn] == [(f"{task11.SCRIPT}.png", None)]


def test_vllms_histogram_and_streams_are_read_by_hand():
    """Two /metrics texts: the steps of the load, bucket by bucket; and the chats' tokens between
    the documents' arrival (t = 10.0) and their last first token (t = 10.5) count the steps,
    but the first."""
    def text(counts: dict[str, int], total: int) -> str:
        lines = ["# HELP vllm:iteration_tokens_total Tokens per step.",
                 "# TYPE vllm:iteration_tokens_total histogram"]
        lines += [f'vllm:iteration_tokens_total_bucket{{engine="0",le="{le}"}} {n}'
                  for le, n in counts.items()]
        lines += [f'vllm:iteration_tokens_total_count{{engine="0"}} {counts["+Inf"]}',
                  f'vllm:iteration_tokens_total_sum{{engine="0"}} {total}']
        return "\n".join(lines) + "\n"

    before = text({"8.0": 3, "64.0": 3, "2048.0": 4, "+Inf": 4}, 1000)
    after = text({"8.0": 50, "64.0": 60, "2048.0": 62, "+Inf": 62}, 4000)
    steps_ = iteration_tokens(before, after)
    assert steps_ == IterationTokens(58, 3000, {8: 47, 64: 10, 2048: 1})
    assert steps_.steps_over(64) == 1 and steps_.steps_over(8) == 11
    assert iteration_tokens("", "") is None

    from common.load import RequestResult
    chats = [RequestResult(True, 6, start_s=9.0, token_times_s=[0.2, 0.9, 1.1, 1.3, 1.5, 1.7]),
             RequestResult(True, 6, start_s=9.1, token_times_s=[0.1, 0.8, 1.0, 1.2, 1.4, 1.6])]
    longs = [RequestResult(True, 2, start_s=10.0, ttft_s=0.3),
             RequestResult(True, 2, start_s=10.0, ttft_s=0.5)]
    # 10.1 (it ends the step running when the documents came), 10.3, 10.5: 2 steps
    assert prefill_steps(chats, longs) == 2
    assert tokens_at_arrival(chats, longs) == 2      # 9.2, 9.9 and 9.2, 9.9 before 10.0
    chats[1].token_times_s = [0.1, 0.8, 1.0, 1.2]    # ended at 10.3, before the last first token
    assert prefill_steps(chats, longs) is None


def totals_hold(res: ChunkedPrefill, num_prompt: int) -> None:
    """Every run: each step within its budget; all num_prompt prompt tokens prefilled once (no
    cache, no preemption) and a decode for every new token but each request's first."""
    s = res.settings
    num_decode = s.num_chats * (s.chat_output_tokens - 1) + \
        s.num_long_docs * (s.long_output_tokens - 1)
    for run in res.mini_engine:
        t = run.timeline
        per_step = [d + p for d, p in zip(t.decode_tokens, t.prefill_tokens)]
        assert max(per_step) == run.max_step_tokens <= run.budget_tokens, run.label
        assert (sum(t.prefill_tokens), sum(t.decode_tokens)) == (num_prompt, num_decode)
        assert len(per_step) == run.num_steps
        assert [len(times) for times in t.chat_token_times_s] == [s.chat_output_tokens] * 4


def test_task_11_on_the_tiny_model(tiny_model, capsys):
    """main() itself, --no-vllm: 4 chats of 12 tokens, then 2 documents of 100 tokens of text
    (133-135 prompt tokens) making 4 each, with no chunking and at budgets 64, 32 and 16."""
    record = task11.main(["--model", tiny_model, "--dtype", "float32", "--no-vllm",
                          "--chat-output", "12", "--long-tokens", "100", "--long-output", "4",
                          "--budgets", "64,32,16"])
    out = capsys.readouterr().out
    assert_fits(out)
    assert record.correct == Correctness(6, [6, 6, 6], 2, 2)
    assert record.num_identical_in_dtype == [6, 6, 6]      # fp32 runs the same tokens
    assert record.settings.max_model_len == 256            # the tiny model's own limit
    w = record.workload
    assert w.source == "/usr/share/common-licenses/GPL-3" or "not found" in out
    workload = make_workload(_tokenizer(tiny_model), 4, 2, 100)
    assert sum(map(len, workload.long_prompts)) == w.num_long_prompt_tokens
    totals_hold(record, sum(map(len, workload.prompts)))
    off = record.mini_engine[0]
    # no chunking: a document whole in one step, with the chats' 4 decodes
    assert off.max_step_tokens >= w.min_long_prompt_tokens + 4
    assert [r.budget_tokens for r in record.mini_engine] == [256, 64, 32, 16]
    assert [r.label for r in record.mini_engine] == ["no chunking", "budget 64", "budget 32",
                                                     "budget 16"]
    assert record.vllm is None and "3. vLLM" not in out
    # no chunking and the smallest budget in 3 passes, taking turns; the budgets between once
    assert [r.passes.max_itl_s.num_passes if r.passes else 1 for r in record.mini_engine] == \
        [3, 1, 1, 3]
    note = " ".join(out.split()).partition("no chunking and budget 16:")[2]
    assert_says(note, "the median pass", "of 3")       # the runs named: those of 3 passes
    res = steps.by_name()[task11.SCRIPT].load()
    assert res == record
    assert summary_row(res).startswith("stall ") and "vLLM" not in summary_row(res)
    assert "task_11_chunked_prefill.png" in out and "not drawn" not in out


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("args, message", [
    (["--budgets", "0"], "'0' must be greater than 0"),
    (["--budgets", "64,8"], "--budgets 8 is smaller than --max-batch 16"),
    (["--budgets", "512,256,128,64,32,16"], "--budgets: at most 5 budgets, not 6"),
    (["--page-size", "48"], "--page-size 48 does not divide 2048"),
    (["--chats", "0"], "'0' must be greater than 0"),
    (["--long-tokens", "x"], "'x' is not a whole number"),
    (["--port", "70000"], "'70000' is not a port"),
    # the documents arrive after each chat's 8th token: a chat of 8 would be over by then
    (["--chat-output", "8"], "--chat-output 8 must be over 8"),
    (["--chat-output", "1"], "--chat-output 1 must be over 8"),
    (["--max-batch", "3000", "--budgets", "4096"], "--max-batch 3000 is larger than "
                                                   "max_model_len 2048"),
    (["--base-url", "http://127.0.0.1:1", "--no-vllm"], "--base-url runs part 3"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        task11.parse_args(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and message in lines[0]


def test_a_workload_that_cannot_fit_is_one_line(tiny_model, capsys):
    """The tiny model's 256 tokens cannot hold a document of 300 (nor 20 of 1,200 the text)."""
    for args, message in ((["--long-tokens", "300"], "exceed max_model_len 256: lower "
                                                     "--long-tokens"),
                          (["--long-docs", "20"], "--long-docs 20 x --long-tokens 1200 is more "
                                                  "than the")):
        with pytest.raises(SystemExit) as exit_:
            task11.main(["--model", tiny_model, "--no-vllm", *args])
        lines = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(lines) == 1 and message in lines[0], lines


@pytest.mark.engine
@pytest.mark.xdist_group("speculating_server")
def test_task_11_against_a_server_given_by_base_url(tiny_model, speculating_server, capsys):
    """--base-url: part 3 runs once, at that server's own setting ("its own": here vLLM's
    default budget, speculating with its ngram; the server task 12's --base-url test shares),
    and the task neither restarts nor stops it; no vLLM line of the insight or the summary
    compares settings it did not choose."""
    port = speculating_server.port
    record = task11.main(["--model", tiny_model, "--dtype", "float32", "--chat-output", "24",
                          "--long-tokens", "100", "--long-output", "4", "--budgets", "32",
                          "--base-url", f"http://127.0.0.1:{port}/v1"])
    assert server.running_config(port) == speculating_server   # the same server, untouched
    out = capsys.readouterr().out
    assert_fits(out)
    (run,) = record.vllm
    assert (run.label, run.budget_tokens, run.startup_s) == ("its own", None, None)
    assert run.level.num_ok == 6 and run.latency and run.steps.num_steps > 0
    assert record.settings.base_url == f"http://127.0.0.1:{port}/v1"
    assert "for vLLM, at its own setting" in " ".join(out.split())
    assert "Starting vLLM server" not in out
    assert not any(line.startswith("vLLM") for line in task_11_report.insights(record))
    assert "vLLM" not in summary_row(record)


@pytest.mark.lab_steps("task_11_chunked_prefill")
def test_task_11_on_the_real_model_holds_the_budget_and_changes_no_token(lab_run):
    # task 11 (--quick): 4 chats of 39-42 prompt tokens make 16 tokens each; one document of
    # 300 tokens of the text (about 333 with its template) arrives after 8 and makes 8. Without
    # chunking its prefill is one step of all its tokens; at a budget of 64 no step of
    # mini_engine computes more than 64.
    # The same tokens at every budget in fp32, and against transformers.
    assert lab_run.args("task_11_chunked_prefill") == [
        "--port", str(lab_run.port), "--budgets", "64", "--chat-output", "16", "--long-docs",
        "1", "--long-tokens", "300", "--long-output", "8"]
    t11 = lab_run.saved("task_11_chunked_prefill")
    assert t11["correct"] == {"num_requests": 5, "num_identical": [5], "num_checked_hf": 2,
                              "num_identical_hf": 2}
    runs = t11["mini_engine"]
    assert [r["label"] for r in runs] == ["no chunking", "budget 64"]
    assert [r["budget_tokens"] for r in runs] == [2048, 64]
    assert all(r["max_step_tokens"] <= r["budget_tokens"] for r in runs)
    assert runs[1]["max_step_tokens"] == 64
    assert runs[0]["max_step_tokens"] >= t11["workload"]["min_long_prompt_tokens"]
    # every prompt token computed once and every output token made once, whatever the budget:
    # the prompts' tokens, then 4 x 15 + 7 tokens made by decode steps (each request's first
    # token comes from its prompt's last chunk)
    prompt_tokens = sum(runs[0]["timeline"]["prefill_tokens"])
    assert prompt_tokens >= 4 * 39 + t11["workload"]["min_long_prompt_tokens"]
    for r in runs:
        assert sum(r["timeline"]["prefill_tokens"]) == prompt_tokens
        assert sum(r["timeline"]["decode_tokens"]) == 4 * 15 + 7
    # vLLM, part 3: the lab's server started without chunking, restarted at a budget of 64, and
    # stopped at the end; every request answered at both settings, the same tokens in all;
    # without chunking no step held more than its 2,048 (vLLM counts a prompt whole in the step
    # of its first token, so a chunked prompt shows as a step over the budget: at least one at
    # 64, the document's)
    vllm = t11["vllm"]
    assert [(r["label"], r["budget_tokens"]) for r in vllm] == [("no chunking", 2048),
                                                                ("budget 64", 64)]
    assert [r["level"]["num_ok"] for r in vllm] == [5, 5]
    assert all(r["startup_s"] for r in vllm)                # it started both
    assert vllm[0]["steps"]["num_tokens"] == vllm[1]["steps"]["num_tokens"]
    over = [int(b) for b, n in vllm[0]["steps"]["steps_by_bucket"].items() if n]
    assert max(over) <= 2048
    assert sum(n for b, n in vllm[1]["steps"]["steps_by_bucket"].items()
               if int(b) > 64) >= 1
    # every stream timed, the document's TTFT among them; the document went the moment every
    # chat had streamed 8 tokens (read from their streams)
    assert all(r["latency"] and len(r["latency"]["long_ttft_s"]) == 1 for r in vllm)
    assert all(8 <= r["num_chat_tokens_at_arrival"] <= 10 for r in vllm)
    # its report: part 3, and the restart from no chunking to the budget (that it stops the
    # server after: tests/lab/test_lab.py, no step after it finds one to stop)
    report = (lab_run.results_dir / "task_11_chunked_prefill.txt").read_text()
    assert "3. vLLM" in report and "Stopping the lab server on" in report
    assert "(vLLM " in lab_run.row("task_11_chunked_prefill")
