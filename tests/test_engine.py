"""Task 9's engine, built from scratch: token for token against transformers on the tiny model
(tests/test_lab.py checks the real one, in task 9's own run), under preemption, the two batching
policies on a workload worked out by hand, and task 9 end to end. Counts and tokens are
asserted, never times."""
from __future__ import annotations

from argparse import Namespace

import pytest

import task_9_build_your_own_engine as task9
from common import settings
from mini_engine import LLMEngine, Llama, State
from mini_engine.engine import eos_token_ids
from tests.conftest import assert_fits, run_script, saved_result


def engine_args(**overrides) -> Namespace:
    return Namespace(**{"kv_bytes": settings.KV_CACHE_BYTES, "page_size": 16, "max_batch": 16,
                        "seed": 0, **overrides})


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """(folder, our model, transformers' model, tokenizer), fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    return tiny_model, Llama(tiny_model), hf, AutoTokenizer.from_pretrained(tiny_model)


def test_check_prompts_differ_in_length(tiny):
    tokenizer = tiny[3]
    lengths = [len(tokenizer(p)["input_ids"]) for p in task9.CHECK_PROMPTS]
    assert len(lengths) >= 8 and len(set(lengths)) == len(lengths)


def test_identical_to_transformers_on_the_tiny_model(tiny):
    folder, model, hf, tokenizer = tiny
    c = task9.check_correctness(model, eos_token_ids(folder), hf, tokenizer, engine_args())
    assert c["mismatches"] == [] and c["num_identical"] == c["num_prompts"] == 8
    assert c["steps"] == task9.CHECK_TOKENS     # all 8 prefilled in one step, then decoded together


def test_identical_under_preemption_and_every_page_comes_back(tiny):
    """A pool of 10 pages (one full request of 128 tokens needs 8) for 8 requests of up to
    29 + 32 tokens (2-4 pages each): the scheduler must preempt and recompute."""
    import torch

    folder, model, hf, tokenizer = tiny
    page_bytes = model.kv_bytes_per_token * 16
    eng = LLMEngine(model, eos_token_ids(folder), kv_bytes=10 * page_bytes, page_size=16,
                    max_batch=8)
    prompts = [tokenizer(p)["input_ids"] for p in task9.CHECK_PROMPTS]
    seqs = [eng.add_request(ids, 32, min_tokens=32) for ids in prompts]
    while eng.scheduler.has_work:
        eng.step()
        held = [page for s in eng.scheduler.running for page in s.page_table]
        assert len(held) == len(set(held)), "a page held by two requests"
        assert not set(held) & set(eng.block_manager.free_queue)
        assert len(held) + eng.block_manager.num_free == 10
    assert eng.scheduler.num_preemptions > 0
    assert sum(s.num_preemptions for s in seqs) == eng.scheduler.num_preemptions
    assert eng.block_manager.num_free == 10
    for ids, seq in zip(prompts, seqs):
        assert seq.state is State.FINISHED and seq.page_table == []
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, pad_token_id=tokenizer.eos_token_id)
        assert seq.output_ids == ref[0, len(ids):].tolist()


@pytest.mark.parametrize("policy, pad, rows", [
    # lengths 8, 1, 1, 1 in arrival order, cap 2, one token per live request per step:
    # static runs [8, 1] for 8 steps (the finished one as padding), then [1, 1]: 9 steps
    ("static", True, [2] * 8 + [2]),
    # finished rows dropped from the compute, but no one admitted before the batch ends
    ("static", False, [2] + [1] * 7 + [2]),
    # continuous refills the slot of each 1-token request at the next step: 8 steps
    ("continuous", True, [2, 2, 2, 1, 1, 1, 1, 1]),
])
def test_policies_on_a_workload_worked_out_by_hand(tiny, policy, pad, rows):
    folder, model, _, tokenizer = tiny
    eng = LLMEngine(model, eos_token_ids(folder), settings.KV_CACHE_BYTES, page_size=16,
                    max_batch=2, policy=policy, pad_finished=pad)
    prompt = tokenizer("Hello there")["input_ids"]
    seqs = [eng.add_request(prompt, n, min_tokens=n) for n in (8, 1, 1, 1)]
    eng.run()
    assert [s.num_rows for s in eng.steps] == rows
    assert max(s.num_rows for s in eng.steps) <= 2
    assert [len(s.output_ids) for s in seqs] == [8, 1, 1, 1]
    assert [s.num_live for s in eng.steps] == ([2] + [1] * 7 + [2] if policy == "static"
                                                else rows)
    assert eng.block_manager.num_free == eng.num_pages


@pytest.mark.parametrize("label, policy, pad, steps", [("static", "static", True, 9),
                                                      ("continuous", "continuous", True, 8)])
def test_a_policy_run_on_the_hand_workload(tiny, label, policy, pad, steps):
    """Task 9's figures of one policy run, on the workload above (outputs 8, 1, 1, 1, cap 2):
    11 tokens; static 9 steps, so 11 / (2 slots x 9) = 61 % of its slot-steps made a token;
    continuous 8 steps, 11 / 16 = 69 %. Each request's prompt and output fit one page of 16, so
    2 rows hold at most 2 pages, where reserving 128 tokens per row would hold 2 x 8 = 16."""
    folder, model, _, tokenizer = tiny
    prompt = tokenizer("Hello there")["input_ids"]
    workload = [task9.Request(prompt, n) for n in (8, 1, 1, 1)]
    run, _ = task9.run_policy(model, eos_token_ids(folder), workload, engine_args(max_batch=2),
                              label, policy, pad)
    assert (run.num_tokens, run.num_steps) == (11, steps)
    assert run.slot_utilization == pytest.approx({9: 0.6111, 8: 0.6875}[steps], abs=1e-4)
    assert (run.peak_pages, run.contiguous_pages, run.num_preemptions) == (2, 16, 0)


def test_the_ratios_task_9_saves_by_hand():
    # continuous 50 tok/s, static 40, vLLM 40: 50 / 40 = 1.25x static and 1.25x vLLM
    def run(label, tokens_per_s):
        return task9.PolicyRun(label, tokens_per_s, 1.0, 50, 0.1, 0.2, 0.05, 10, 0.5, 4, 16, 0)
    runs = {"static": run("static", 40.0), "continuous": run("continuous", 50.0)}
    args = Namespace(requests=4, mean_output=8, seed=0, max_batch=2, page_size=16,
                     kv_bytes=1, policy="both")
    data = task9.result(args, {}, runs, runs["continuous"], {"tokens_per_s": 40.0}, None, {}, {},
                        {}, [], {})
    assert (data["continuous_over_static"], data["engine_over_vllm"]) == (1.25, 1.25)
    data = task9.result(args, {}, {"static": runs["static"]}, runs["static"], None, None, {},
                        {}, {}, [], {})
    assert "continuous_over_static" not in data and "engine_over_vllm" not in data


def test_workload_is_seeded_and_fits(tiny):
    tokenizer = tiny[3]
    a = task9.make_workload(tokenizer, 48, 32, seed=0)
    assert a == task9.make_workload(tokenizer, 48, 32, seed=0)
    assert a != task9.make_workload(tokenizer, 48, 32, seed=1)
    assert all(1 <= r.num_output and len(r.prompt_ids) + r.num_output <= 128 for r in a)


def test_task_9_end_to_end_on_the_tiny_model(tiny_model):
    """Parts 1, 2 and 3 (part 4, vLLM and transformers on the workload, runs on the real model
    in tests/test_lab.py)."""
    proc = run_script("task_9_build_your_own_engine.py", "--model", tiny_model,
                      "--dtype", "float32", "--requests", "6", "--max-batch", "3",
                      "--mean-output", "6", "--no-vllm", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = saved_result("task_9_build_your_own_engine")
    assert r["correctness"]["num_identical"] == 8 and r["correctness"]["mismatches"] == []
    lengths = r["workload_output_lengths"]
    assert len(lengths) == 6
    policies = r["policies"]
    assert set(policies) == {"static", "static no-pad", "continuous"}
    for p in policies.values():
        assert p["num_tokens"] == sum(lengths) and p["num_preemptions"] == 0
    # static runs each batch of 3 to its longest request; continuous needs no more steps
    static_steps = max(lengths[:3]) + max(lengths[3:])
    assert policies["static"]["num_steps"] == policies["static no-pad"]["num_steps"] == static_steps
    assert policies["continuous"]["num_steps"] <= static_steps
    assert r["vllm"] is None and r["transformers_static"] is None
    assert "engine_over_vllm" not in r and "AGAINST THE REAL THING" not in proc.stdout
    assert set(r["phases"]) == {"1", "3"}
    assert "8/8 (every token" in proc.stdout
    assert_fits(proc.stdout)


def test_task_9_with_a_pool_of_one_request_ends_under_every_policy(tiny_model):
    """The hang a learner met: --kv-bytes for a pool of just one request of 128 tokens (the tiny
    model's fp32 KV is 2 x 2 layers x 1 KV head x 64 x 4 B = 1,024 B a token: 131,072 B = 8 pages
    of 16) and more requests than the cap (seed 0 drew a workload on which static batching
    with padding stepped a batch of padding alone for ever). Every policy ends, each with every
    token."""
    proc = run_script("task_9_build_your_own_engine.py", "--model", tiny_model,
                      "--dtype", "float32", "--requests", "8", "--max-batch", "3",
                      "--mean-output", "40", "--kv-bytes", "131072", "--no-vllm", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = saved_result("task_9_build_your_own_engine")
    policies = r["policies"]
    assert set(policies) == {"static", "static no-pad", "continuous"}
    assert all(p["num_tokens"] == sum(r["workload_output_lengths"]) for p in policies.values())
    assert all(p["peak_pages"] <= 8 for p in policies.values())
    assert sum(p["num_preemptions"] for p in policies.values()) > 0


@pytest.mark.parametrize("args, message", [
    (["--requests", "0"], "'0' must be greater than 0"),
    (["--max-batch", "-1"], "'-1' must be greater than 0"),
    (["--mean-output", "x"], "'x' is not a whole number"),
    (["--page-size", "48"], "--page-size 48 does not divide max_model_len 128"),
    (["--policy", "fifo"], "invalid choice: 'fifo'"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message, capsys):
    """Refused by the parser, before anything loads (in-process: the same parser the script
    runs; the case below runs the script itself)."""
    with pytest.raises(SystemExit) as exit_:
        task9.parse_args(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and message in lines[0]


def test_a_budget_smaller_than_one_request_is_one_line_and_exit_2(tiny_model):
    proc = run_script("task_9_build_your_own_engine.py", "--model", tiny_model,
                      "--kv-bytes", "1000")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == ["ERROR: --kv-bytes 1,000 cannot hold one request of 128 tokens "
                     "(131,072 B in float32)"], proc.stderr


def test_every_linear_kernel_computes_the_same_product():
    """Each candidate of mini_engine/linear.py, fused or not, against x @ W.T written out, on the
    tiny model's shapes: the choice made at load changes the speed, never the maths."""
    import torch

    from mini_engine import linear as lin

    torch.manual_seed(0)
    parts = [torch.randn(128, 64), torch.randn(64, 64), torch.randn(64, 64)]   # q, k, v
    x = torch.randn(5, 64)
    reference = x @ torch.cat(parts).T
    kernels = lin.available_kernels(torch.float32)
    assert [k.name for k in kernels][:2] == ["F.linear", "W @ x.T"]
    for kernel in kernels:
        for fused in (True, False):
            y = lin.Linear(parts, kernel, fused)(x)
            assert y.shape == (5, 256) and torch.allclose(y, reference, rtol=1e-4, atol=1e-4)


def test_the_choice_is_the_fastest_measured_and_builds_back():
    import torch

    from mini_engine import linear as lin

    layers = {"qkv": [[torch.randn(96, 32), torch.randn(32, 32), torch.randn(32, 32)]] * 2,
              "down": [[torch.randn(32, 64)]] * 2}          # two layers of each kind
    choices, built = lin.choose(layers, torch.float32, [1, 4], budget_s=0.003)
    kernels = [k.name for k in lin.available_kernels(torch.float32)]
    # qkv: every kernel fused and unfused; down: one part, so no fusion to choose
    assert set(choices["qkv"].seconds) == {f"{k}{s}" for k in kernels for s in ("", ", unfused")}
    assert set(choices["down"].seconds) == set(kernels)
    for c in choices.values():
        assert c.seconds[c.chosen] == min(c.seconds.values())
        assert [linear.label for linear in built[c.kind]] == [c.chosen] * 2
        assert lin.build(layers[c.kind][0], c.chosen).label == c.chosen


def test_a_forced_kernel_makes_the_same_tokens_as_the_measured_choice(tiny):
    folder, model, _, tokenizer = tiny
    forced = Llama(folder, linear="F.linear")
    assert set(forced.linear_labels.values()) == {"F.linear"} and forced.linear_choices == {}
    assert set(model.linear_choices) == {"qkv", "o", "gate_up", "down", "lm_head"}
    outputs = []
    for m in (model, forced):
        eng = LLMEngine(m, eos_token_ids(folder), settings.KV_CACHE_BYTES, max_batch=4)
        seqs = [eng.add_request(tokenizer(p)["input_ids"], 12, min_tokens=12)
                for p in task9.CHECK_PROMPTS[:4]]
        eng.run()
        outputs.append([s.output_ids for s in seqs])
    assert outputs[0] == outputs[1]
