"""Task 10: its record built by hand (hand_result), saved and read back whole, the summary's row,
what its figure plots and its report printed from the record; end to end on the tiny model
(parts 1-3: mini_engine's prefix cache; part 4, vLLM's, runs on the real model in the lab's quick
run, tests/test_lab.py), and its bad flags. Counts of tokens and pages are asserted, worked out by
hand; never times."""
from __future__ import annotations

import pytest

import task_10_prefix_caching as task10
from common import figures, results, settings, steps
from common.load import LoadLevel
from lessons.task_10 import report as task_10_report
from lessons.task_10.record import (Correctness, EngineRun, OfflineRequest, PageSnapshot,
                                    ServerRun, Settings, WorkloadShape)
from tests.conftest import assert_fits, run_script, saved_result

HEADER = results.RunHeader("SmolLM2-135M-Instruct", dtype="bfloat16", threads=2)
SHARED = [0, 1, 2, 3, 4]   # 90 shared tokens: 5 whole pages of 16 (80 tokens)


def hand_peak(is_shared: bool) -> PageSnapshot:
    """Step 3, 16 requests running, 7 pages each; the first 4 shown. Shared: pages 0-4 in every
    table (ref count 16) and 2 of its own each: 5 + 16 x 2 = 37 held, against 16 x 7 = 112."""
    if is_shared:
        tables = {i: SHARED + [5 + 2 * i, 6 + 2 * i] for i in range(4)}
        refs = {p: 16 if p in SHARED else 1 for table in tables.values() for p in table}
        return PageSnapshot(3, 37, 112, 16, tables, refs)
    tables = {i: list(range(7 * i, 7 * i + 7)) for i in range(4)}
    return PageSnapshot(3, 112, 112, 16, tables, {p: 1 for t in tables.values() for p in t})


def hand_run(label: str, duration_s: float, cached: int, ttft_s: float, num_pages: int,
             peak: PageSnapshot | None) -> EngineRun:
    """32 requests of 16 new tokens (512 in all), 3,364 prompt tokens."""
    return EngineRun(label, duration_s, 512 / duration_s, 3364, cached, ttft_s, ttft_s * 1.5,
                     num_pages, 0.005, peak)


def hand_server(label: str, duration_s: float, ttft_s: float, queries: int, hits: int
                ) -> ServerRun:
    level = LoadLevel(32, 32, duration_s, 512, 512 / duration_s, mean_latency_s=duration_s * 0.9,
                      p50_latency_s=duration_s * 0.9, p95_latency_s=duration_s,
                      mean_ttft_s=ttft_s, p95_ttft_s=ttft_s * 1.4, mean_tpot_s=0.1)
    return ServerRun(label, level, queries, hits, 20.0)


def hand_result(header: results.RunHeader = HEADER) -> task10.PrefixCaching:
    """The defaults' run of docs/engine.md: 32 chat requests, 90 tokens shared, 5 whole pages;
    31 x 80 = 2,480 of 3,364 prompt tokens from the cache (73.7%), in mini_engine and in vLLM;
    TTFT 2.22 -> 1.05 s (mini_engine), 2.15 -> 1.02 s (vLLM). Its summary row: "hit 74%, TTFT
    2.22 -> 1.05 s, vLLM hit 74%"."""
    return task10.PrefixCaching(
        Settings(num_requests=32, num_system_tokens=80, num_output_tokens=16, seed=0,
                 page_size_tokens=16, max_num_seqs=16, max_model_len=128,
                 kv_cache_bytes=settings.KV_CACHE_BYTES, port=8000, is_vllm_measured=True),
        WorkloadShape(num_shared_tokens=90, num_prompt_tokens=3364, min_prompt_tokens=103,
                      max_prompt_tokens=107),
        Correctness(num_requests=32, num_identical=32, cached_prompt_tokens=2480,
                    prompt_tokens=3364, num_checked_hf=3, num_identical_hf=3),
        31,
        [hand_run("cache off", 3.9, 0, 2.22, 128, hand_peak(False)),
         hand_run("cache on", 2.5, 2480, 1.05, 53, hand_peak(True))],
        [hand_run("cache off", 3.93, 0, 2.3, 128, hand_peak(False)),
         hand_run("cache on", 3.80, 0, 2.2, 128, hand_peak(False))],
        [hand_server("cache off", 4.0, 2.15, 0, 0), hand_server("cache on", 2.6, 1.02, 3364, 2480)],
        {"first request": OfflineRequest(106, 0), "request 2": OfflineRequest(103, 80),
         "first request again": OfflineRequest(106, 96)},
        header=header)


def test_the_record_reads_back_whole():
    record = hand_result()
    results.save(task10.SCRIPT, record)
    step = steps.by_name()[task10.SCRIPT]
    assert step.record is task10.PrefixCaching and step.figures == task10.FIGURES
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
    assert task10.summary_row(record) == "hit 74%, TTFT 2.22 -> 1.05 s, vLLM hit 74%"
    assert steps.by_name()[task10.SCRIPT].row(record) == task10.summary_row(record)
    record.vllm = None                                   # --no-vllm
    assert task10.summary_row(record) == "hit 74%, TTFT 2.22 -> 1.05 s"


def test_what_the_figure_plots():
    record = hand_result()
    results.save(task10.SCRIPT, record)
    fig = task10.draw_shared_pages(record)
    grid, bars = fig.axes
    # a cell per logical page of the 4 tables shown, 7 each; the 5 shared pages say "xN"
    cells = [t.get_text() for t in grid.texts if not t.get_text().startswith("request")]
    assert len(cells) == 28 and sum("\nx16" in c for c in cells) == 4 * 5
    assert [t.get_text() for t in grid.texts if t.get_text().startswith("request")] == \
        ["request 1", "request 2", "request 3", "request 4"]
    # held shared, if unshared, mini_engine's peak with the cache on and off
    assert [b.get_width() for b in bars.patches] == [37, 112, 53, 128]
    assert grid.get_xlabel() == "logical page (tokens 16i to 16i+15)"
    assert bars.get_xlabel() == "KV pages of 16 tokens"
    assert "step 3" in grid.get_title() and bars.get_title() == "16 requests running"
    figures.plt().close(fig)


def test_the_figure_has_a_title_axes_with_units_and_a_caption():
    results.save(task10.SCRIPT, hand_result())
    step = steps.by_name()[task10.SCRIPT]
    res = step.load()
    assert [suffix for suffix, _ in step.figures] == [""]
    fig = step.figures[0][1](res)
    assert fig.get_suptitle() == ("Task 10: requests with the same system prompt point at the "
                                  "same pages")
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
    assert task10.draw_shared_pages(record) is None


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

    assert "32/32 requests identical, every token (2,480 of 3,364 prompt tokens" in text
    assert "3/3 identical (the first requests, cache on)" in text
    assert "0* 1* 2* 3* 4* 5 6" in out and "0* 1* 2* 3* 4* 11 12" in out
    assert "page 0: 16, page 1: 16, page 2: 16, page 3: 16, page 4: 16" in text
    assert "37 for 16 running requests, 112 if each held its own" in text
    assert "53 with the cache, 128 without" in text
    for header in ("Chat workload", "Control (no page shared)", "Streamed, all at once"):
        line = next(line for line in lines if line.startswith(header))
        assert line.split()[-4:] == ["cache", "off", "cache", "on"], line
    assert cells("Prompt tokens computed") == ["3,364", "884"]
    assert cells("  taken from the cache") == ["0", "2,480"]
    assert cells("Peak pages in use") == ["128", "53"]
    assert cells("Outputs as cache off") == ["off", "31/32"]   # in the cache-on column
    assert cells("Prefix cache hits (tokens)") == ["0", "2,480"]
    assert cells("  of queries (tokens)") == ["0", "3,364"]
    assert cells("Hit rate (/metrics)") == ["-", "73.7%"]
    assert cells("Succeeded") == ["32/32", "32/32"]
    vllm = lines[next(i for i, line in enumerate(lines) if line.startswith("Streamed")):]
    assert next(line for line in vllm if line.startswith("TTFT mean")).split()[-2:] == \
        ["2.15", "1.02"]
    # 5 whole blocks of 16: at most 31 x 80 = 2,480 of 3,364 (73.7%)
    assert "at most 31 x 80 = 2,480 of 3,364 prompt tokens can hit (73.7%)" in text
    assert "first request 0 of 106; request 2 80 of 103; first request again 96 of 106" in text
    assert "The cache changed no token: 32/32 requests identical in fp32" in text
    assert "In bfloat16, 31/32 matched; fp32 matched 32/32, so the difference is rounding" in text
    assert "cut the prompt tokens computed by 74%" in text   # 1 - 884 / 3,364
    assert "TTFT mean 2.22 -> 1.05 s, 1.56x tokens/s" in text   # 3.9 s against 2.5 s
    assert "Pages held at the peak: 53 with sharing, 128 without" in text
    assert "vLLM found 74% of the prompt tokens in its cache: TTFT mean 2.15 -> 1.02 s, " \
           "1.54x tokens/s" in text                          # 4.0 s against 2.6 for 512 tokens


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
    # 90 shared tokens = 5 whole pages of 16 (80 tokens); the first request computes them, the 5
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
    assert_fits(proc.stdout)
    # read back typed, as the summary and the report page read it
    res = steps.by_name()[task10.SCRIPT].load()
    assert res.vllm is None and res.offline is None
    hit = 400 / res.workload.num_prompt_tokens
    assert res.mini_engine[1].hit_fraction == hit
    assert task10.summary_row(res).startswith(f"hit {100 * hit:.0f}%, TTFT ")
    assert "vLLM hit" not in task10.summary_row(res)
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
