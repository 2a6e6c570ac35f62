"""Task 14: its record built by hand (tests/hand/), saved and read back whole, the figures that
follow from others (users, the speed-ups, the summary's row), the insight lines both ways, its
report and figure printed from the record; end to end on the tiny model (mini_engine's side: the
capacity read from the engine equals the arithmetic); its bad flags. vLLM's side runs on the
real model in the lab's quick run (the last test here), as every server test of the lab does.
Counts are asserted, never times."""
from __future__ import annotations

import pytest

import task_14_quantized_kv as task14
from common import figures, results, steps
from lessons.task_14 import report as task_14_report
from lessons.task_14.record import QuantizedKV, summary_row
from tests.conftest import assert_fits
from tests.hand import assert_figure_reads_well
from tests.hand.task_14_quantized_kv import SUMMARY_ROW
from tests.hand.task_14_quantized_kv import record as hand_result
from tests.says import assert_says


def test_the_record_reads_back_whole():
    record = hand_result()
    results.save(task14.SCRIPT, record)
    step = steps.by_name()[task14.SCRIPT]
    assert step.record is QuantizedKV and step.figures == task14.FIGURES
    assert step.load() == record


def test_the_figures_that_follow_from_others():
    record = hand_result()
    s = record.settings
    assert [c.users(s) for c in record.capacity] == [45, 22, 91, 88]   # pages x 32 // 128
    assert record.speedup("mini_engine") == pytest.approx(2.0)       # 300 / 150 tok/s
    assert record.speedup("vLLM") == pytest.approx(0.8)              # 160 / 200
    assert record.quality_of("vLLM", "fp8 token") is None
    record.throughput = record.throughput[:1]
    assert record.speedup("mini_engine") is None


def test_the_summary_row():
    record = hand_result()
    assert summary_row(record) == SUMMARY_ROW
    assert steps.by_name()[task14.SCRIPT].row(record) == SUMMARY_ROW
    record.throughput, record.quality = [], []
    assert summary_row(record) == "1.94x tokens"


def test_the_insight_says_what_the_figures_show():
    lines = task_14_report.insight(hand_result())
    assert len(lines) == 3
    # 364 x 32 = 11,648 and 353 x 32 = 11,296 against 182 x 32 = 5,824: 2.00x and 1.94x; the
    # scales 11,880 - 11,520 = 360 B
    assert_says(lines[0], "128 MiB", "11,648", "11,296", "5,824", "bfloat16", "2.00x", "1.94x",
                "360 B", "11,880")
    assert_says(lines[1], "4 of 8", "0.060", "1 of 8", "0.250", "1 of 8", "0.270", "3 empty",
                branch="was better", not_branch="not better")
    assert_says(lines[2], "16 prompts of 200 tokens", "16 MiB", "2 at once", "bfloat16",
                "4 in 8 bits", "2.00x", "0.80x", branch="slower in 8 bits")


def test_the_insight_changes_when_the_figures_do():
    record = hand_result()
    record.quality[1].mean_abs_logprob_change = 0.3                 # token worse than layer
    record.throughput[3].seconds = 3.2                              # vLLM 240 / 200 = 1.20x
    lines = task_14_report.insight(record)
    assert_says(lines[1], "0.300", "0.250", branch="not better", not_branch="was better")
    assert_says(lines[2], "2.00x", "1.20x", not_branch="slower")
    record.quality = [q for q in record.quality if q.engine == "mini_engine"]   # --no-vllm
    record.throughput = record.throughput[:2]
    lines = task_14_report.insight(record)
    assert_says(lines[1], "0.300", not_branch="vLLM's fp8 kept")
    assert_says(lines[2], "2.00x", not_branch="vLLM")


def test_the_report_prints_every_part(capsys):
    task_14_report.print_report(hand_result())
    out = capsys.readouterr().out
    assert_fits(out)
    rows = [line.split() for line in out.splitlines()]
    assert ["fp8", "token", "11,880", "353", "11,296", "88", "353", "-"] in rows
    assert ["bfloat16", "23,040", "182", "5,824", "45", "182", "22", "of", "22"] in rows
    assert "2.00x tokens/s" in out and "0.80x tokens/s" in out


def test_the_figure_reads_well():
    record = hand_result()
    results.save(task14.SCRIPT, record)
    assert_figure_reads_well(task14.FIGURES[0][1](record), record)
    figures.plt().close("all")


def test_task_14_on_the_tiny_model(tiny_model, capsys):
    """mini_engine's side end to end (fp32): the pages each engine made are the arithmetic's,
    every format ran, part 3's 8-bit cache held more tokens than fp32's."""
    record = task14.main(["--model", tiny_model, "--dtype", "float32", "--quick", "--no-vllm"])
    s = record.settings
    assert [c.name for c in record.capacity] == ["float32", "bfloat16", "fp8 layer", "fp8 token"]
    for c in record.capacity:
        assert c.pages == s.kv_cache_bytes // (c.bytes_per_token * s.page_tokens)
        assert c.vllm_blocks is None
    # read from an engine for every format but bfloat16, which an fp32 model does not run
    assert [c.mini_engine_pages for c in record.capacity] == [
        c.pages if c.name != "bfloat16" else None for c in record.capacity]
    assert [q.name for q in record.quality] == ["fp8 layer", "fp8 token", "fp8_e5m2 layer",
                                                "fp8_e5m2 token"]
    assert all(len(q.first_differences) == 4 for q in record.quality)
    base, fp8 = record.throughput
    assert base.num_tokens == fp8.num_tokens == 6 * 16                  # EOS held off
    assert fp8.capacity_tokens > base.capacity_tokens
    assert results.load(task14.SCRIPT, QuantizedKV) == record
    assert s.kv_read == "one pass of C each (kv_quant.c)"   # this machine has a C compiler
    out = capsys.readouterr().out
    assert "wrote and read its 8-bit pages in one pass of C each (kv_quant.c)" in " ".join(
        out.split())
    assert_fits(out)                                                   # the progress lines too


@pytest.mark.parametrize("args, message", [
    (["--prompts", "13"], "at most 12"),
    (["--passage", "1"], "--passage"),
    (["--load-mib", "0"], "--load-mib"),
])
def test_bad_flags_get_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        task14.parse_args(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.lab_steps("task_14_quantized_kv")
def test_task_14_on_the_real_model(lab_run):
    """The quick lab's task 14: mini_engine at each format; vLLM's server at auto and fp8, its
    blocks as the arithmetic says, both engines' part 3."""
    record = QuantizedKV.from_dict(lab_run.saved(task14.SCRIPT))
    s = record.settings
    # rows: the run's dtype, the other of bf16 and fp32 (derived only), fp8 layer, fp8 token
    run_dtype, _, layer, token = record.capacity
    assert [c.mini_engine_pages for c in record.capacity] == [run_dtype.pages, None,
                                                              layer.pages, token.pages]
    assert run_dtype.vllm_blocks == run_dtype.load_pages and token.vllm_blocks is None
    # vLLM refuses an 8-bit cache on a CPU without AVX-512 or AMX (cpu_attn.py): one line
    refused = record.vllm_skipped is not None
    assert layer.vllm_blocks in ((None, layer.load_pages) if refused else (layer.load_pages,))
    assert ("vLLM", "fp8 layer") in {(q.engine, q.name) for q in record.quality} or refused
    assert [t.engine for t in record.throughput][:3] == ["mini_engine"] * 2 + ["vLLM"]
    assert all(t.num_tokens == s.load_requests * s.load_tokens for t in record.throughput)
    assert lab_run.row(task14.SCRIPT) == summary_row(record)
