"""Tasks 3-4: the source's figures, exactly, and bad input as one line with exit code 2; their
figures (what the pool's plots, worked out by hand; every figure titled, its axes labelled, a
caption) and a script that draws its figure and says so, or says in one line why it could not."""
from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import task_3_kv_cache_problem as task3
import task_4_paged_attention as task4
from common import figures, kv, report, steps
from lessons.task_3 import report as show3
from lessons.task_4 import figure as task_4_figure
from lessons.task_4 import report as show4
from tests import hand
from tests.helpers import assert_says, run_script, saved_result


def test_task3_reproduces_the_source(model_args, capsys):
    r = task3.main(model_args)
    assert [q.waste_pct for q in r.requests] == [91.2, 75.0, 95.5, 50.0, 86.9]
    assert [q.used_slots for q in r.requests] == [45, 128, 23, 256, 67]
    assert (r.allocated_slots, r.used_slots) == (2560, 519)
    assert (r.utilization_pct, r.waste_pct) == (20.3, 79.7)
    assert (r.users_contiguous, r.users_ideal) == (19, 97)
    out = capsys.readouterr().out
    assert ("  Request 1 (Short question): 45/512 used (91.2% wasted)\n"
            "    [####..............................................]\n") in out
    assert ("  Request 3 (Quick greeting): 23/512 used (95.5% wasted)\n"
            "    [##................................................]\n") in out
    assert "5.1x fewer users" in out            # 97 / 19, not the source's misprinted "19x"
    assert saved_result("task_3_kv_cache_problem")["users_ideal"] == 97


def test_task4_reproduces_the_source(model_args, capsys):
    r = task4.main(model_args)
    assert [q.num_pages for q in r.requests] == [3, 8, 2, 16, 5]
    assert [q.waste_pct for q in r.requests] == [6.2, 0.0, 28.1, 0.0, 16.2]
    assert r.contiguous == task4.Slots(allocated_slots=2560, used_slots=519, utilization_pct=20.3)
    paged = r.paged
    assert (paged.allocated_slots, paged.used_slots, paged.utilization_pct) == (544, 519, 95.4)
    assert (r.slots_saved, r.memory_ratio) == (2016, 4.7)
    assert (r.users_contiguous, r.users_paged, r.users_ratio) == (19, 92, 4.8)
    # The pool is what contiguous reserves for ONE request: 512 / 16 = 32 pages. All five decode
    # at once, a token each per step, and give their pages back when done, so they finish at
    # different times: after step 23 (Quick greeting), 45, 67, 128 and 256. In use at once, by
    # hand: step 23: 2+2+2+2+2 = 10; step 45: 3+3+3+3 = 12; step 67: 5+5+5 = 15 (cdiv(t, 16)
    # each); step 128: Medium paragraph 8 + Long document 8 = 16; then Long document alone grows
    # to 16. Peak 16, not the 34 pages the five hold in all.
    assert (paged.num_pool_pages, paged.num_pages_peak, paged.num_preempted) == (32, 16, 0)
    assert paged.peak_step == 113       # the 8th page each of Medium paragraph and Long document
    assert paged.num_pages_free_after == 32                 # every page came back
    assert [q.finish_step for q in r.requests] == [45, 128, 23, 256, 67]
    # Pages go out in token order from a first-in first-out free list: 32 fresh ids for the first
    # 32 pages; the 33rd and 34th (Long document's 15th and 16th, at tokens 225 and 241) are the
    # first pages freed: Quick greeting's 2 and 7, freed at step 23.
    assert r.requests[2].page_ids == [2, 7]
    assert r.requests[3].page_ids[-2:] == [2, 7] and paged.num_pages_reused == 2
    ids = [i for q in r.requests for i in q.page_ids]
    assert len(ids) == 34 and len(set(ids)) == 32
    out = capsys.readouterr().out
    assert "  Request 3: 23 tokens -> 2 blocks (32 slots), waste 28.1%\n    Blocks: [##|##]\n" in out
    peak = next(line for line in out.splitlines() if line.startswith("Most in use at once"))
    assert_says(peak, "16 of 32", "step 113")
    assert "Memory saved: 2016 slots (4.7x less memory)" in out
    # the KV unit is vLLM's "block"; "page" only in the paper's name (and a term's definition)
    said = " ".join(out.split("\nSaved:")[0].split())          # the paths name the script
    for definition in report.TERMS.values():
        said = said.replace(definition, "")
    said = said.replace("PagedAttention", "").replace("the report page", "")   # (the HTML one)
    assert "page" not in said.lower()
    lines = show4.insights(kv.allocate_contiguous([45, 128, 23, 256, 67], 512),
                           task4.run_paged([45, 128, 23, 256, 67], list("abcde"), 16, 32))
    assert_says(lines[0], "20.3%", "95.4%", branch="less than one block",
                not_branch=("where it was", "lower"))
    assert_says(lines[1], branch="every request holds blocks that are not next to each other",
                not_branch=("happened to lie", "of the 5"))
    assert_says(lines[2], "16 of the 32 blocks", "2 freed blocks",
                branch="went to requests still growing", not_branch="no freed block")
    assert len(lines) == 3                                   # no preemption line


def test_bytes_section_uses_the_model_config(real_model, capsys):
    """The real model in bf16: 2 x 30 layers x 3 KV heads x 64 x 2 B = 23,040 B per token."""
    r = task4.main(["--dtype", "bfloat16"])
    b = r.in_bytes
    assert b.kv_bytes_per_token == 23_040
    assert b.budget_token_slots == 134_217_728 // 23_040 == 5_825
    assert list(b.users_in_budget.values()) == [5_825 // 512, 5_825 // 108] == [11, 53]
    r = task3.main(["--dtype", "float32"])
    assert r.in_bytes.kv_bytes_per_token == 46_080


def test_tiny_model_bytes(model_args):
    # 2 (K,V) x 2 layers x 1 KV head x 64 dims x 4 B
    assert task3.main(model_args).in_bytes.kv_bytes_per_token == 1_024


def test_custom_lengths(model_args):
    r = task4.main(["--lengths", "1,16,17", "--max-len", "32", "--block-size", "16",
                    "--total-slots", "100", *model_args])
    assert [q.num_pages for q in r.requests] == [1, 1, 2]
    assert r.paged.allocated_slots == 64 and r.contiguous.allocated_slots == 96
    # contiguous: 100 slots // 32 per request = 3 users; paged: 1 + 1 + 2 pages of 16 = 64
    # slots for 3 requests, 21 a request on average (64 // 3), and 100 // 21 = 4 users
    assert (r.users_contiguous, r.mean_paged_slots, r.users_paged) == (3, 21, 4)


def test_paged_run_reuses_and_preempts():
    # pool of 2 pages: request 3 waits a step for a page; request 1 (1 token) frees page 0 after
    # step 1, request 3 takes it at step 2, and page 1 when request 2 (16 tokens) is done
    r = task4.run_paged([1, 16, 17], ["a", "b", "c"], page_size=16, num_pool_pages=2)
    assert [s.page_table for s in r.sequences] == [[0], [1], [0, 1]]
    assert (r.num_pages_peak, r.num_pages_reused, r.num_preempted) == (2, 2, 0)
    assert r.finish_steps == [1, 16, 18] and r.num_free_after == 2
    # two requests that each need the whole pool of 4 pages: at step 33 both hold 2 and neither
    # can go on, so the newer (b) gives its pages back and starts over; at step 50 a holds 3, b 1:
    # b again; then a takes the last page, finishes at step 66, and b runs alone (67-130)
    r = task4.run_paged([64, 64], ["a", "b"], page_size=16, num_pool_pages=4)
    assert [s.num_tokens for s in r.sequences] == [64, 64]
    assert (r.num_preempted, r.finish_steps, r.num_free_after) == (2, [66, 130], 4)
    with pytest.raises(task4.OutOfPages):
        task4.run_paged([65], ["a"], page_size=16, num_pool_pages=4)


def test_the_insight_of_every_branch_keeps_its_limits(capsys):
    """Task 4's insight on the source's run and on runs that take the other branches (a
    preemption, no block handed out again, utilisation not raised, blocks side by side); task
    3's on the source's five: each within the lab's limits, each bullet a whole sentence."""
    preempting = task4.run_paged([64, 64], ["a", "b"], 16, 4)       # preempted twice
    lines = show4.insights(kv.allocate_contiguous([64, 64], 64), preempting)
    assert_says(lines[-1], "filled up 2 times", branch="gave all its blocks back")
    short = task4.run_paged([20, 20], ["a", "b"], 16, 4)            # blocks 0, 2 and 1, 3
    assert_says(show4.insights(kv.allocate_contiguous([20, 20], 32), short)[2], "4 of the 4",
                branch="no freed block was handed out again", not_branch="still growing")
    tight = task4.run_paged([17], ["a"], 16, 2)                     # 32 slots for 17, max 20
    tight_lines = show4.insights(kv.allocate_contiguous([17], 20), tight)
    assert_says(tight_lines[0], "85.0%", "53.1%", branch="lower the utilisation",
                not_branch=("less than one block", "where it was"))
    assert_says(show4.insights(kv.allocate_contiguous([20, 20], 32), short)[0], "62.5%",
                branch="where it was", not_branch=("raise", "lower"))
    assert_says(tight_lines[1], branch="happened to lie next to each other",
                not_branch="not next to each other")
    source = task4.run_paged([45, 128, 23, 256, 67], list("abcde"), 16, 32)
    args = SimpleNamespace(max_len=512, total_slots=10_000)
    contiguous = kv.allocate_contiguous([45, 128, 23, 256, 67], 512)
    task3_lines = show3.insights(args, contiguous, 19, 97)
    assert_says(task3_lines[1], "79.7%", branch="holds nothing")
    assert_says(task3_lines[2], "19 instead of 97", "10,000 slots", branch="not how fast")
    for lines in (show4.insights(contiguous, source), lines, tight_lines, task3_lines,
                  show4.insights(kv.allocate_contiguous([20, 20], 32), short)):
        capsys.readouterr()
        report.insight(lines)
        printed = capsys.readouterr().out.splitlines()[2:-1]
        assert len(lines) <= report.MAX_INSIGHT_BULLETS
        assert len(printed) <= report.MAX_INSIGHT_LINES, printed
        assert all(line[0].isupper() and line.endswith(".") for line in lines), lines


def test_page_allocator_runs_out_and_frees():
    allocator = task4.PageAllocator(num_pages=2, page_size=4)
    seq = task4.Sequence("s")
    for _ in range(8):
        seq.append_slot(allocator)
    assert seq.page_table == [0, 1] and allocator.num_free == 0
    with pytest.raises(task4.OutOfPages):
        seq.append_slot(allocator)
    allocator.free(seq.page_table)
    assert allocator.num_free == 2


def test_capacity_derivation_matches_vllm_reports():
    # SPEC: vLLM reported 5,760 tokens / 45.00x in bf16 and 2,816 / 22.00x in fp32 (block 128).
    bf16 = kv.derive_capacity(23_040, 134_217_728, 128, 128)
    assert (bf16.num_blocks, bf16.num_tokens, bf16.max_concurrency) == (45, 5_760, 45.0)
    fp32 = kv.derive_capacity(46_080, 134_217_728, 128, 128)
    assert (fp32.num_blocks, fp32.num_tokens, fp32.max_concurrency) == (22, 2_816, 22.0)


@pytest.mark.parametrize("script", ["task_3_kv_cache_problem.py", "task_4_paged_attention.py"])
@pytest.mark.parametrize("args, message", [
    (["--lengths", "45,abc"], "'abc' is not a whole number"),
    (["--lengths", "45,-5"], "'-5' must be greater than 0"),
    (["--lengths", "45,,3"], "is not a comma-separated list"),
    (["--lengths", "600", "--max-len", "512"], "--lengths 600 is longer than --max-len 512"),
    (["--dtype", "fp16"], "invalid choice: 'fp16'"),
    (["--total-slots", "0"], "'0' must be greater than 0"),
    (["--model", "/no/such/model"], "not found"),
])
def test_bad_input_is_one_line_and_exit_2(script, args, message):
    proc = run_script(script, *args, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_zero_block_size_is_refused():
    """--block-size (vLLM's word), or --page-size (the paper's), the same flag."""
    for flag in ("--block-size", "--page-size"):
        proc = run_script("task_4_paged_attention.py", flag, "0")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            "task_4_paged_attention.py: error: argument --block-size/--page-size: '0' must be "
            "greater than 0 (see --help)"]


# --- the saved results, read back -------------------------------------------------------------
@pytest.mark.parametrize("task", [task3, task4])
def test_the_saved_result_reads_back_as_the_record_main_returned(task, model_args):
    record = task.main(model_args)
    step = steps.by_name()[task.SCRIPT]
    assert step.record is type(record) and step.load() == record
    assert step.row(step.load()) == {task3: "utilisation 20.3%",
                                     task4: "utilisation 95.4%, users 4.8x"}[task]


# --- the figures ------------------------------------------------------------------------------
def test_the_pool_at_its_peak_of_the_source_requests():
    """Task 4's five requests in a 32-page pool (test_task4_reproduces_the_source works them
    out). Pages go out fresh, in token order, one per request in turn: step 1 pages 0-4 (R1-R5),
    step 17 pages 5-9, step 33 pages 10-13 (R3 finished at 23), step 49 14-16 (R1 at 45), step 65
    17-19, then R2 and R4 alone (R5 at 67): 20-21 at step 81, 22-23 at 97, 24-25 at 113. At step
    113 R2 and R4 hold 8 pages each: the peak, 16 of 32, so the grid shows 16 pages held and 16
    free (the whole run held all 32 and two of them twice)."""
    names = ["a", "b", "c", "d", "e"]
    run = task4.run_paged([45, 128, 23, 256, 67], names, page_size=16, num_pool_pages=32)
    assert (run.num_pages_peak, run.peak_step) == (16, 113)
    held = task_4_figure.pool_at_peak(task4.saved_requests(run), 32)
    assert {page: h for page, h in enumerate(held) if h} == {
        **{page: (1, logical) for logical, page in enumerate([1, 6, 11, 14, 17, 20, 22, 24])},
        **{page: (3, logical) for logical, page in enumerate([3, 8, 12, 15, 18, 21, 23, 25])}}
    assert held.count(None) == 32 - 16


def test_the_pool_title_says_what_the_grid_cannot():
    """The grid shows one step; whether freed pages went out again is said in its title, chosen
    by the run's count: 2 for the source's requests (Quick greeting's pages 2 and 7, to Long
    document); none for two requests of 20 tokens in a pool of 4 (2 pages each, at steps 1 and
    17: the peak, 4 of 4, at step 17)."""
    source = task4.run_paged([45, 128, 23, 256, 67], list("abcde"), 16, 32)
    assert_says(task_4_figure.pool_title(pool_figures(source)), "step 113", "16 of 32 blocks",
                "2 freed blocks", branch="went to requests still growing",
                not_branch=("no freed block", "page"))
    short = task4.run_paged([20, 20], ["a", "b"], 16, 4)
    assert_says(task_4_figure.pool_title(pool_figures(short)), "step 17", "4 of 4 blocks",
                branch="no freed block was handed out again", not_branch=("still growing", "page"))


def pool_figures(run: task4.PagedRun) -> task4.PagedFigures:
    """What task 4 saves of a run's pool (its slots' figures left at 0: the title reads none)."""
    return task4.PagedFigures(0, 0, 0.0, run.num_pool_pages, run.num_pages_peak,
                              run.num_pages_reused, run.num_preempted, run.num_free_after,
                              run.peak_step)


def test_every_figure_has_a_title_axes_with_units_and_a_caption(model_args):
    """Tasks 3-4's figures, as the lab draws them: the steps list's, from the saved result."""
    task3.main(model_args)
    task4.main(model_args)
    for name in ("task_3_kv_cache_problem", "task_4_paged_attention"):
        step = steps.by_name()[name]
        r = step.load()
        assert [suffix for suffix, _ in step.figures] == [""]      # one figure each
        for suffix, draw in step.figures:
            fig = draw(r)
            hand.assert_figure_reads_well(fig, r, (name, suffix))
            figures.plt().close(fig)


def test_a_script_draws_its_figure_and_says_so(model_args, capsys):
    task3.main(model_args)
    out = capsys.readouterr().out
    png = figures.png_path("task_3_kv_cache_problem")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the report's last lines (a long path wraps onto lines of its own)
    squashed = re.sub(r"\s+", "", out)
    assert squashed.endswith(f"Saved:{figures.png_path('task_3_kv_cache_problem').with_suffix('.json')}"
                             f"Figure:{png}")


def test_a_figure_that_fails_is_one_line_not_a_crash(model_args, capsys, monkeypatch):
    def broken(res):
        raise KeyError("requests")
    monkeypatch.setattr(task3, "FIGURES", (("", broken),))
    r = task3.main(model_args)
    assert r.utilization_pct == 20.3                     # the task ran and saved its result
    assert saved_result("task_3_kv_cache_problem")["utilization_pct"] == 20.3
    out = " ".join(capsys.readouterr().out.split())     # the line wraps at 65 columns
    assert out.endswith("Figure task_3_kv_cache_problem.png not drawn: KeyError: 'requests'")
