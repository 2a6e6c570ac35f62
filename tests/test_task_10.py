"""Task 10 end to end on the tiny model (parts 1-3: mini_engine's prefix cache; part 4, vLLM's,
runs on the real model in the lab's quick run, tests/test_lab.py), and its bad flags. Counts of
tokens and pages are asserted, worked out by hand; never times."""
from __future__ import annotations

import pytest

import task_10_prefix_caching as task10
from tests.conftest import assert_fits, run_script, saved_result


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
    assert r["identical_in_dtype"] == 6
    off, on = r["mini_engine"]
    # 90 shared tokens = 5 whole pages of 16 (80 tokens); the first request computes them, the 5
    # others (admitted in the same step) take them from the cache: 5 x 80 = 400 tokens
    assert (off["cached_prompt_tokens"], on["cached_prompt_tokens"]) == (0, 400)
    assert on["prompt_tokens"] == off["prompt_tokens"] == r["prompt_tokens"]
    # at the peak every request holds the 5 shared pages + its own: prompts of 102-106 tokens
    # and 4 new ones (3 computed) fill 7 pages each, 2 of them its own: 5 + 6 x 2 = 17 vs 6 x 7
    assert (on["peak_pages"], off["peak_pages"]) == (17, 42)
    assert on["peak"]["ref_counts"] == {**{str(p): 6 for p in range(5)},
                                        **{str(p): 1 for p in on["peak"]["ref_counts"]
                                           if int(p) >= 5}}
    assert all(c["cached_prompt_tokens"] == 0 for c in r["control"])
    assert r["vllm"] is None and "4. vLLM" not in proc.stdout
    assert "32/32" not in proc.stdout and "6/6 requests" in proc.stdout
    assert_fits(proc.stdout)


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
