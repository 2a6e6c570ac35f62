"""Task 10: its record built by hand (hand_result, from tests/hand/), saved and read back whole, the
summary's row, what its figure plots and its report printed from the record; end to end on the
tiny model (parts 1-3: mini_engine's prefix cache; part 4, vLLM's, runs on the real model in the
lab's quick run: the lab_run fixture, tests/conftest.py, checked by the last test here), and its
bad flags. Counts of tokens and pages are asserted, worked out by
hand; never times."""
from __future__ import annotations

import itertools

import pytest

import task_10_prefix_caching as task10
from common import figures, results, settings, steps
from common.report import LABEL_WIDTH
from common.measure import Spread
from lessons.task_10 import report as task_10_report
from lessons.task_10 import FIGURES
from lessons.task_10.figure import draw_shared_pages
from lessons.task_10.record import summary_row
from tests.hand.task_10_prefix_caching import SUMMARY_ROW
from tests.hand.task_10_prefix_caching import record as hand_result
from common import report
from tests.helpers import assert_fits, assert_says, run_script, saved_result


@pytest.fixture(autouse=True)
def terms_unsaid(monkeypatch):
    """Each test a run of its own: a term's first use there says its few words."""
    monkeypatch.setattr(report, "_said", set())


def test_the_record_reads_back_whole():
    record = hand_result()
    results.save(task10.SCRIPT, record)
    step = steps.by_name()[task10.SCRIPT]
    assert step.record is task10.PrefixCaching and step.figures == FIGURES
    loaded = step.load()
    assert loaded == record
    assert loaded.mini_engine[1].peak.page_tables[3] == [0, 1, 2, 3, 4, 11, 12]   # int keys
    assert loaded.offline["request 2"].num_cached_tokens == 80
    # the JSON: every list of runs in one order, cache off then cache on; nothing of a run's
    # outputs or its figures that follow from the counts is saved
    saved = results.load_raw(task10.SCRIPT, "")
    assert [r["label"] for r in saved["mini_engine"] + saved["control"] + saved["vllm"]] == \
        ["cache off", "cache on"] * 3
    assert set(saved) >= {"settings", "workload", "correct", "num_identical_in_dtype",
                          "mini_engine", "control", "vllm", "offline"}
    assert set(saved["mini_engine"][1]) == {
        "label", "duration_s", "tokens_per_s", "prompt_tokens", "cached_prompt_tokens",
        "mean_ttft_s", "p95_ttft_s", "num_pages_peak", "bookkeeping_s", "peak"}
    assert set(saved["mini_engine"][1]["peak"]) == {
        "step", "num_pages_held", "num_pages_unshared", "num_running", "page_tables", "ref_counts"}
    assert set(saved["vllm"][1]) == {"label", "level", "prefix_cache_query_tokens",
                                     "prefix_cache_hit_tokens", "startup_s"}
    assert [r["prefix_cache_hit_tokens"] for r in saved["vllm"]] == [0, 2480]
    assert [r["level"]["num_ok"] for r in saved["vllm"]] == [32, 32]
    assert saved["offline"]["first request again"] == {"prompt_tokens": 106,
                                                      "num_cached_tokens": 96}
    assert saved["settings"]["page_size_tokens"] == 16
    assert saved["workload"]["num_shared_tokens"] == 90


def test_the_summary_row():
    record = hand_result()
    # 2,480 of 3,364 prompt tokens from the cache: 73.7%, shown as 74%
    assert summary_row(record) == SUMMARY_ROW == "hit 74%, TTFT 2.22 -> 1.05 s, vLLM hit 74%"
    assert steps.by_name()[task10.SCRIPT].row(record) == summary_row(record)
    record.vllm = None                                   # --no-vllm
    assert summary_row(record) == "hit 74%, TTFT 2.22 -> 1.05 s"


def test_what_the_figure_plots():
    record = hand_result()
    results.save(task10.SCRIPT, record)
    fig = draw_shared_pages(record)
    grid, bars = fig.axes
    # a cell per logical page of the 4 tables shown, 7 each; the 5 shared pages say "xN"
    cells = [t.get_text() for t in grid.texts if not t.get_text().startswith("request")]
    assert len(cells) == 28 and sum("\nx16" in c for c in cells) == 4 * 5
    assert [t.get_text() for t in grid.texts if t.get_text().startswith("request")] == \
        ["request 1", "request 2", "request 3", "request 4"]
    # held shared, if unshared, mini_engine's peak with the cache on and off
    assert [b.get_width() for b in bars.patches] == [37, 112, 53, 128]
    assert grid.get_xlabel() == "logical block (tokens 16i to 16i+15)"
    assert bars.get_xlabel() == "KV blocks of 16 tokens"
    assert "step 3" in grid.get_title() and bars.get_title() == "16 requests running"
    figures.plt().close(fig)


def test_the_figure_has_a_title_axes_with_units_and_a_caption():
    results.save(task10.SCRIPT, hand_result())
    step = steps.by_name()[task10.SCRIPT]
    res = step.load()
    assert [suffix for suffix, _ in step.figures] == [""]
    fig = step.figures[0][1](res)
    assert fig.get_suptitle().startswith("Task 10: ")            # the task it belongs to
    caption = fig.get_supxlabel()
    assert "bfloat16" in caption and "cores" in caption and "SmolLM2-135M-Instruct" in caption
    assert res.measured_at[:10] in caption and settings.cpu_model_name() in caption
    for ax in fig.axes:
        # an axes that plots something names what it plots: an x or a y label with text
        if ax.axison and ax.has_data():
            assert [label for label in (ax.get_xlabel(), ax.get_ylabel()) if label.strip()], \
                ax.get_title()
    figures.plt().close(fig)
    drawn = figures.draw(task10.SCRIPT, res, step.figures)
    assert [(path.name, why) for path, why in drawn] == [(f"{task10.SCRIPT}.png", None)]
    assert drawn[0][0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_record_without_page_tables_draws_nothing():
    record = hand_result()
    record.mini_engine[1].peak = None
    assert draw_shared_pages(record) is None


def test_the_insight_says_what_the_figures_show():
    lines = task_10_report.insights(hand_result())
    assert len(lines) == 5
    # fp32: 32 of 32 identical with the cache on and off; bfloat16: 31 of 32 matched, so the
    # one that differs is rounding, not the cache
    assert_says(lines[0], "no token in fp32 (32/32)", "bfloat16 31/32",
                branch=("changed no token", "rounding"), not_branch="a bug")
    # 1 - 884 / 3,364 = 74% fewer prompt tokens computed; TTFT 2.22 -> 1.05 s; 512 tokens in
    # 2.5 s against 3.9 s: 3.9 / 2.5 = 1.56x; one run each (the hand record has no passes)
    assert_says(lines[1], "74%", "2.22 to 1.05 s", "1.56x", branch="one run each",
                not_branch=("fell", "rose", "overlap"))
    # 53 pages at the peak with sharing, 128 without: 128 / 53 = 2.4x the requests
    assert_says(lines[2], "53", "128", "2.4x")
    # the control (nothing shared): 512 / 3.80 = 134.7 tokens/s against 512 / 3.93 = 130.3
    # (+3.4%); bookkeeping 5 ms either way, a gap under 1% of 3.8 s (38 ms), which is under the
    # 0.13 s between the runs: noise
    assert_says(lines[3], "134.7 tokens/s", "130.3", "+3.4%", "5 ms", "3.8 s", "5 ms",
                branch="noise")
    # vLLM: 2,480 of 3,364 prompt tokens hit (74%); TTFT 2.15 -> 1.02 s; 4.0 / 2.6 = 1.54x
    assert_says(lines[4], "74%", "2.15 to 1.02 s", "one pass each", branch="vLLM took")
    record = hand_result()
    record.num_identical_in_dtype = 32                  # bfloat16 matched all too
    assert_says(task_10_report.insights(record)[0], "32/32 requests identical in fp32",
                branch="changed no token", not_branch=("rounding", "a bug"))


def test_the_insight_changes_when_the_figures_do():
    record = hand_result()
    record.correct.num_identical = 30                   # 2 differ in fp32
    record.num_identical_in_dtype = 32                  # bfloat16 matched all: no rounding
    record.control[1].bookkeeping_s = 0.200             # the cache on's look-ups: 200 ms
    record.vllm[1].prefix_cache_query_tokens = 0        # nothing looked up: no hit rate
    lines = task_10_report.insights(record)
    assert len(lines) == 4
    assert_says(lines[0], "2 of 32 requests", "fp32", branch="a bug",
                not_branch="changed no token")
    assert not any("rounding" in line for line in lines)
    # bookkeeping 200 ms against 5: 195 ms apart, over 1% of 3.8 s: the cache's own cost, so
    # the gap is not called noise
    assert_says(lines[3], "134.7 tokens/s", "130.3", "200 ms", "3.8 s", "5 ms",
                not_branch="noise")
    assert not any(line.startswith("vLLM") for line in lines)
    record.vllm = None                                  # --no-vllm
    assert not any(line.startswith("vLLM") for line in task_10_report.insights(record))
    # a bug in fp32 is not explained away as rounding, whatever bfloat16 showed
    record.num_identical_in_dtype = 29
    assert not any("rounding" in line for line in task_10_report.insights(record))


def test_passes_in_turns_decide_whether_the_control_gap_is_noise():
    """With passes, the control's tokens/s ranges decide: overlapping, the gap is noise; apart,
    it is not, whatever one run each would have said. The summary row shows TTFT's range."""
    record = hand_result()
    off, on = record.control                         # 134.7 against 130.3 tok/s, 5 ms each
    off.tokens_per_s_spread = Spread(130.3, 126.0, 133.0, 3)
    on.tokens_per_s_spread = Spread(134.7, 131.0, 138.0, 3)    # overlaps 126-133
    assert_says(task_10_report.insights(record)[3], "+3.4%", "median of 3 passes each",
                branch="noise", not_branch="one run each")
    on.tokens_per_s_spread = Spread(134.7, 134.0, 138.0, 3)    # apart from 126-133
    assert_says(task_10_report.insights(record)[3], "+3.4%", "median of 3 passes each",
                not_branch=("noise", "one run each"))
    chat_off, chat_on = record.mini_engine
    chat_off.ttft_spread, chat_on.ttft_spread = Spread(2.22, 2.1, 2.4, 3), Spread(1.05, 1.0,
                                                                                  1.2, 3)
    # each TTFT with its range (its passes'), where one pass shows none (test_the_summary_row)
    assert_says(summary_row(record), "hit 74%", "2.22 (2.10-2.40) -> 1.05 (1.00-1.20) s",
                "vLLM hit 74%")


def test_the_ttft_sentence_says_what_the_passes_tell_apart():
    """mini_engine's chat TTFT, cache off against on, by their passes' ranges: apart and lower,
    it fell; apart and higher, it rose; overlapping (the lab's noisy run: 3.62-13.46 s against
    1.18-12.01), not told apart, whatever the medians say."""
    off, on = hand_result().mini_engine                 # 2.22 -> 1.05 s, 1.56x tokens/s
    off.ttft_spread, on.ttft_spread = Spread(2.22, 2.1, 2.4, 3), Spread(1.05, 1.0, 1.2, 3)
    assert_says(task_10_report.ttft_sentence(off, on), "2.22 to 1.05 s", "1.56x",
                branch=("fell", "every pass"), not_branch=("rose", "overlap", "one run"))
    on.mean_ttft_s, on.ttft_spread = 2.9, Spread(2.9, 2.5, 3.1, 3)
    assert_says(task_10_report.ttft_sentence(off, on), "2.22 to 2.90 s", "1.56x",
                branch=("rose", "every pass"), not_branch=("fell", "overlap", "one run"))
    on.mean_ttft_s, on.ttft_spread = 1.05, Spread(1.05, 1.0, 2.3, 3)     # overlaps 2.1-2.4
    assert_says(task_10_report.ttft_sentence(off, on), "2.22 to 1.05 s",
                branch=("overlap", "not told apart"), not_branch=("fell", "rose", "1.56x"))


def test_the_key_insight_keeps_its_limits(capsys):
    """At most 5 bullets and 12 printed lines, whichever sentences the figures chose (the
    longest: rounding in bfloat16, the TTFT passes overlapping, the control's gap unexplained);
    the whole report under 100 lines."""
    def insight_lines(out: str) -> list[str]:
        return out.split("KEY INSIGHT:\n")[1].split("=" * report.WIDTH)[0].splitlines()

    record = hand_result()
    task_10_report.print_report(record)
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= report.MAX_LINES
    assert len(insight_lines(out)) <= report.MAX_INSIGHT_LINES
    (off, on), (c_off, c_on) = record.mini_engine, record.control
    off.ttft_spread, on.ttft_spread = Spread(12.92, 3.62, 13.46, 3), Spread(14.05, 1.18, 14.01, 3)
    off.tokens_per_s_spread, on.tokens_per_s_spread = Spread(28.8, 19.9, 87.4, 3), Spread(
        54.7, 17.9, 215.6, 3)
    c_off.tokens_per_s_spread = Spread(130.3, 126.0, 133.0, 3)
    c_on.tokens_per_s_spread = Spread(134.7, 134.0, 138.0, 3)     # apart, bookkeeping small
    c_off.ttft_spread, c_on.ttft_spread = Spread(2.3, 2.2, 2.4, 3), Spread(2.2, 2.1, 2.3, 3)
    lines = task_10_report.insights(record)
    assert "not told apart" in lines[1] and "does not explain" in lines[3]
    task_10_report.print_report(record)
    out = capsys.readouterr().out
    assert len(lines) <= report.MAX_INSIGHT_BULLETS
    assert len(insight_lines(out)) <= report.MAX_INSIGHT_LINES, out
    assert len(out.splitlines()) <= report.MAX_LINES
    assert_fits(out)


def test_the_report_from_the_record(capsys):
    """Every part printed from the record alone, vLLM's columns in the record's order (cache
    off, then on) as mini_engine's are."""
    task_10_report.print_report(hand_result())
    out = capsys.readouterr().out
    assert_fits(out)
    lines = out.splitlines()
    text = " ".join(line.strip() for line in lines)   # the report's wrapped lines, joined

    def cells(label: str) -> list[str]:
        """The last two cells of the table row label: cache off, cache on."""
        return next(line for line in lines if line.startswith(label + "  ")).split()[-2:]

    def row(label: str) -> str:
        """The value of the report's row label, its wrapped lines (under the value) joined."""
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{label}:"))
        wrapped = itertools.takewhile(lambda line: line.startswith(" " * LABEL_WIDTH),
                                      lines[at + 1:])
        return " ".join(line[LABEL_WIDTH:].strip() for line in (lines[at], *wrapped))

    assert_says(row("Cache on vs off"), "32/32 requests", "2,480 of 3,364 prompt tokens")
    assert "3/3 identical (cache on)" in text
    assert "0* 1* 2* 3* 4* 5 6" in out and "0* 1* 2* 3* 4* 11 12" in out
    assert_says(row("Request 1 block table"), "0* 1* 2* 3* 4* 5 6")
    assert_says(row("Ref counts (* shared)"), *(f"block {p}: 16," for p in range(4)),
                "block 4: 16")
    assert_says(row("Blocks held then"), "37", "16 running", "112")   # shared; if each its own
    assert "53 with the cache, 128 without" in text
    # vLLM's word, block, for the KV unit ("page" only in the line that names the report page)
    assert " page" not in text.lower().replace("the report page", "")
    assert f"TTFT ({report.TERMS['TTFT']})" in text and "More (each pass, each request)" in text
    assert "TTFT, 95th" not in text and "Each run is the median pass" not in text   # --detail
    for header in ("Chat workload", "Control (no block shared)", "Streamed, all at once"):
        line = next(line for line in lines if line.startswith(header))
        assert line.split()[-4:] == ["cache", "off", "cache", "on"], line
    assert cells("Prompt tokens computed") == ["3,364", "884"]
    assert cells("  taken from the cache") == ["0", "2,480"]
    assert cells("Peak blocks in use") == ["128", "53"]
    assert cells("Outputs as cache off") == ["off", "31/32"]   # in the cache-on column
    assert cells("Prefix cache hits (tokens)") == ["0", "2,480"]
    assert cells("  of queries (tokens)") == ["0", "3,364"]
    assert cells("Hit rate (/metrics)") == ["-", "73.7%"]
    assert cells("Succeeded") == ["32/32", "32/32"]
    vllm = lines[next(i for i, line in enumerate(lines) if line.startswith("Streamed")):]
    assert next(line for line in vllm if line.startswith("TTFT mean")).split()[-2:] == \
        ["2.15", "1.02"]
    # 90 shared tokens, 5 whole blocks of 16: at most 31 x 80 = 2,480 of 3,364 (73.7%)
    assert_says(text.partition("Why under 100%")[2], "90 tokens", "5 whole blocks of 16",
                "31 x 80 = 2,480 of 3,364", "(73.7%)")
    assert_says(text.partition("num_cached_tokens:")[2], "first request 0 of 106",
                "request 2 80 of 103", "first request again 96 of 106", "its last block")
    # the KEY INSIGHT lines, each printed whole (what they say: the two insight tests above)
    insights = task_10_report.insights(hand_result())
    assert len(insights) == 5
    for line in insights:
        assert line in text


def test_the_chat_workload_shares_its_system_prompt(tiny_model):
    """80 tokens of the instruction text, inside SmolLM's chat template: '<|im_start|>system\\n'
    (3 tokens) before it, '<|im_end|>\\n<|im_start|>user\\n' (6) after it, then the question's
    'User ' (1): 90 tokens every prompt starts with, as counted by the real tokenizer."""
    from transformers import AutoTokenizer

    chat = task10.chat_workload(AutoTokenizer.from_pretrained(tiny_model), 6, 80)
    assert chat.shared_tokens == 90
    assert len(set(map(tuple, chat.prompts))) == 6
    control = task10.control_workload(chat, 16, seed=0)
    assert [sorted(p) for p in control.prompts] == [sorted(p) for p in chat.prompts]
    assert len({tuple(p[:16]) for p in control.prompts}) == 6    # no first page in common


def test_task_10_on_the_tiny_model(tiny_model):
    proc = run_script("task_10_prefix_caching.py", "--model", tiny_model, "--dtype", "float32",
                      "--requests", "6", "--output", "4", "--no-vllm", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = saved_result("task_10_prefix_caching")
    assert r["correct"]["num_identical"] == 6 and r["correct"]["num_identical_hf"] == 3
    assert r["num_identical_in_dtype"] == 6
    off, on = r["mini_engine"]
    # 90 shared tokens = 5 whole blocks of 16 (80 tokens); the first request computes them, the 5
    # others (admitted in the same step) take them from the cache: 5 x 80 = 400 tokens
    assert (off["cached_prompt_tokens"], on["cached_prompt_tokens"]) == (0, 400)
    assert on["prompt_tokens"] == off["prompt_tokens"] == r["workload"]["num_prompt_tokens"]
    assert [x["label"] for x in r["mini_engine"] + r["control"]] == ["cache off", "cache on"] * 2
    # at the peak every request holds the 5 shared pages + its own: prompts of 102-106 tokens
    # and 4 new ones (3 computed) fill 7 pages each, 2 of them its own: 5 + 6 x 2 = 17 vs 6 x 7
    assert (on["num_pages_peak"], off["num_pages_peak"]) == (17, 42)
    assert on["peak"]["ref_counts"] == {**{str(p): 6 for p in range(5)},
                                        **{str(p): 1 for p in on["peak"]["ref_counts"]
                                           if int(p) >= 5}}
    assert all(c["cached_prompt_tokens"] == 0 for c in r["control"])
    assert "vllm" not in r and "offline" not in r and "4. vLLM" not in proc.stdout
    assert r["settings"]["is_vllm_measured"] is False
    assert "32/32" not in proc.stdout and "6/6 requests" in proc.stdout
    assert f"one block ({report.TERMS['block']}) holds 16 tokens" in " ".join(proc.stdout.split())
    assert_fits(proc.stdout)
    # read back typed, as the summary and the report page read it
    res = steps.by_name()[task10.SCRIPT].load()
    assert res.vllm is None and res.offline is None
    hit = 400 / res.workload.num_prompt_tokens
    assert res.mini_engine[1].hit_fraction == hit
    assert summary_row(res).startswith(f"hit {100 * hit:.0f}%, TTFT ")
    assert "vLLM hit" not in summary_row(res)
    assert "task_10_prefix_caching.png" in proc.stdout and "not drawn" not in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "'0' must be greater than 0"),
    (["--system-tokens", "8"], "--system-tokens 8: the instruction text has 132 tokens"),
    (["--page-size", "48"], "--page-size 48 does not divide 256"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        task10.parse_args(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and message in lines[0]


@pytest.mark.lab_steps("task_10_prefix_caching")
def test_task_10_on_the_real_model_shares_the_prefix_pages(lab_run):
    # task 10: 8 chat requests share a 90-token prefix: 5 whole blocks of 16 (80 tokens),
    # computed by the first request, taken from the cache by the 7 others: 560 tokens, in
    # mini_engine and in vLLM (its blocks are 16 tokens too); none with vLLM's cache off.
    # Offline: the first request finds nothing, the second its 80 tokens, the first one
    # again all its whole blocks but the last: floor((106 - 1) / 16) x 16 = 96 of its 106
    assert lab_run.args("task_10_prefix_caching") == ["--port", str(lab_run.port), "--requests",
                                                      "8", "--output", "4"]        # --quick's
    t10 = lab_run.saved("task_10_prefix_caching")
    assert t10["workload"]["num_shared_tokens"] == 90
    assert t10["correct"]["num_identical"] == 8 and t10["correct"]["num_identical_hf"] == 3
    assert [r["cached_prompt_tokens"] for r in t10["mini_engine"]] == [0, 560]
    assert [r["cached_prompt_tokens"] for r in t10["control"]] == [0, 0]
    assert [r["prefix_cache_hit_tokens"] for r in t10["vllm"]] == [0, 560]   # off, on
    assert [r["level"]["num_ok"] for r in t10["vllm"]] == [8, 8]
    assert {k: v["num_cached_tokens"] for k, v in t10["offline"].items()} == {
        "first request": 0, "request 2": 80, "first request again": 96}
    assert t10["offline"]["first request"]["prompt_tokens"] == 106
