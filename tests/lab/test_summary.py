"""The summary from saved results, the roofline arithmetic (exact on given inputs), and the
peak-memory sampler on real processes."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

import summary
import task_7_tuning as task7
from common import machine, measure, memory, results, settings, steps
from common.load import LoadLevel
from lessons.summary import report as printed
from lessons.summary import roofline as rl
from lessons.task_1 import record as task1
from lessons.task_2 import record as task2
from lessons.task_3 import record as task3
from lessons.task_4 import record as task4
from lessons.task_6 import record as task6
from lessons.task_7 import record as task7_record
from lessons.task_6.record import LEVEL, Alone
from lessons.task_8 import record as task8
from lessons.verify_environment import record as verify_environment
from tests import hand
from tests.hand.task_15_serve_your_engine import record as task_15_record
from tests.helpers import (SMOLLM, assert_fits, assert_says, level, row_value, run_script,
                           saved_result)

MACHINE = machine.Machine(bandwidth_bytes_s=20e9, flops_s={"float32": 250e9, "bfloat16": 1e12},
                     threads=2)


def one_request(tokens_per_s: float, total_time_s: float = 0.0, generated_tokens: int = 0,
                name: str = "task_1_hf_baseline", users: int = 1) -> rl.MeasuredStep:
    """A step as summary.measured_steps reads tasks 1 and 2 (total time / generated tokens)."""
    label = {"task_1_hf_baseline": "HF, 1 request", "task_2_vllm_inference": "vLLM, 1 request"}
    ms = 1000 * total_time_s / generated_tokens if generated_tokens else 1000 / tokens_per_s
    return rl.MeasuredStep(name, label[name], users, tokens_per_s, ms, "time / tokens")


def steps_of(t1: tuple, t2: tuple, levels: list[LoadLevel]) -> list[rl.MeasuredStep]:
    """The measured steps of tasks 1, 2 and 6, through summary.measured_steps."""
    res = {"task_1_hf_baseline": hand.fill(task1.HFBaseline, tokens_per_s=t1[0],
                                           total_time_s=t1[1], generated_tokens=t1[2]),
           "task_2_vllm_inference": hand.fill(task2.VLLMInference, tokens_per_s=t2[0],
                                              total_time_s=t2[1], generated_tokens=t2[2]),
           "task_6_multi_user_load": hand.fill(task6.MultiUserLoad, levels=levels,
                                               scaling_factor=10.0)}
    return summary.measured_steps(res)


# --- roofline arithmetic ----------------------------------------------------------------------
def test_model_cost_counts_the_weights():
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    assert cost.num_params == 134_515_008   # = sum of numel() of the loaded model (task 0)
    # per layer: q, o 576x576; k, v 576x192; gate, up, down 576x1536 = 3,538,944; + LM head
    assert cost.matmul_params == 30 * 3_538_944 + 49_152 * 576 == 134_479_872
    # matmul weights + 30 x 2 norms of 576 + final norm + one embedding row, 2 bytes each
    assert cost.weight_bytes == (134_479_872 + 30 * 1_152 + 576 + 576) * 2 == 269_031_168
    assert cost.kv_bytes_per_context_token == 23_040   # the source's 22.5 KB per token
    assert cost.bytes_per_token(36) == 269_031_168 + 36 * 23_040
    assert cost.flops_per_token(36) == 2 * 134_479_872 + 36 * 4 * 30 * 9 * 64


def test_untied_embeddings_are_counted_twice_in_params_once_in_matmuls():
    cost = machine.model_cost(SMOLLM | {"tie_word_embeddings": False}, "float32", 4)
    assert cost.num_params == 134_515_008 + 49_152 * 576
    assert cost.matmul_params == 134_479_872
    assert cost.kv_bytes_per_context_token == 46_080


def test_ceilings_on_given_inputs():
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    one = rl.ceiling(cost, MACHINE, batch=1, context=36)
    assert one.bound == "bandwidth"
    assert one.read_s == pytest.approx(269_860_608 / 20e9, rel=1e-12)
    assert one.tokens_per_s == pytest.approx(20e9 / 269_860_608, rel=1e-12)      # 74.1
    top = rl.compute_ceiling(cost, MACHINE, context=36)
    assert top == pytest.approx(1e12 / 271_448_064, rel=1e-12)                      # 3,684
    ridge = rl.ridge_batch(cost, MACHINE, context=36)
    assert ridge == pytest.approx((269_031_168 / 20e9) / (271_448_064 / 1e12 - 36 * 23_040 / 20e9),
                                  rel=1e-12)                                        # 58.5
    below, above = (rl.ceiling(cost, MACHINE, b, 36) for b in (58, 59))
    assert (below.bound, above.bound) == ("bandwidth", "compute")
    assert rl.ceiling(cost, MACHINE, 1000, 36).tokens_per_s == pytest.approx(top, rel=1e-12)


def test_tasks_are_placed_under_the_ceilings():
    measured = steps_of((22.0, 0.0, 0), (33.0, 0.0, 0), [level(1, 20.0), level(20, 200.0)])
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    r = rl.place(measured, cost, MACHINE, context=36)
    single = 20e9 / 269_860_608
    assert r.placed["task_1_hf_baseline"].pct_of_bandwidth_ceiling == pytest.approx(
        100 * 22.0 / single, rel=1e-12)
    assert r.placed["task_2_vllm_inference"].pct_of_bandwidth_ceiling == pytest.approx(
        100 * 33.0 / single, rel=1e-12)
    six = r.placed["task_6_multi_user_load"]
    assert six.users == 20
    assert six.pct_of_compute_ceiling == pytest.approx(100 * 200 / (1e12 / 271_448_064), rel=1e-12)
    # 20 requests: one read of the weights + 20 KV caches, against 20 x the FLOPs
    at20 = 20 / max((269_031_168 + 20 * 36 * 23_040) / 20e9, 20 * 271_448_064 / 1e12)
    assert six.roofline_at_users.tokens_per_s == pytest.approx(at20, rel=1e-12)
    # the server's 1-user level sits beside its batch: tokens/s, and the step from requests / tok/s
    assert (six.one_user.tokens_per_s, six.one_user.step_ms) == (20.0, 50.0)


def test_measure_machine_gives_figures():
    measured = machine.measure_machine(threads=2)
    assert measured.bandwidth_bytes_s > 1e8 and measured.threads == 2
    assert set(measured.flops_s) == {"float32", "bfloat16"} and min(measured.flops_s.values()) > 1e8


# --- the three rungs: ceiling, kernel floor, measured step --------------------------------------
def test_linear_shapes_are_the_weights_a_step_multiplies():
    shapes = machine.linear_shapes(SMOLLM)
    assert len(shapes) == 30 * 7 + 1
    # q, k, v, o, gate, up, down of one layer (out, in), and the LM head (vocab x hidden)
    assert shapes[:7] == [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576),
                          (1536, 576), (576, 1536)]
    assert shapes[-1] == (49_152, 576)
    assert sum(o * i for o, i in shapes) == machine.model_cost(SMOLLM, "float32", 4).matmul_params


def test_attribution_on_given_inputs():
    a = rl.attribute_step(ceiling_ms=20.0, floor_ms=73.0, step_ms=85.0)
    assert a.library_ms == pytest.approx(53.0, rel=1e-12)      # floor - ceiling
    assert a.engine_ms == pytest.approx(12.0, rel=1e-12)       # step - floor
    # of the 85 ms step: 20 / 85 = 23.53 %, 53 / 85 = 62.35 %, 12 / 85 = 14.12 %
    assert a.ceiling_pct == pytest.approx(23.529, abs=1e-3)
    assert a.library_pct == pytest.approx(62.353, abs=1e-3)
    assert a.engine_pct == pytest.approx(14.118, abs=1e-3)
    assert a.larger_gap == "library"
    b = rl.attribute_step(ceiling_ms=20.0, floor_ms=30.0, step_ms=85.0)
    assert (b.library_ms, b.engine_ms, b.larger_gap) == (10.0, 55.0, "engine")


def rung_steps() -> list[rl.MeasuredStep]:
    """Tasks 1, 2 and 6 as saved: steps of 50, 34, 50 (1 user) and 100 ms (20 users)."""
    return steps_of((20.0, 2.5, 50), (29.41, 1.7, 50),
                    [level(1, 20.0, 0.05), level(20, 200.0, 0.1)])


def test_every_measured_step_is_placed_on_three_rungs():
    measured = rung_steps()
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    assert rl.floor_batches(measured) == [1, 20]
    floor = machine.KernelFloor("bfloat16", 2, cost.matmul_params, {1: 0.030, 20: 0.060})
    rungs = rl.place(measured, cost, MACHINE, context=36, floor=floor).rungs
    assert [(g.label, g.users) for g in rungs] == [
        ("HF, 1 request", 1), ("vLLM, 1 request", 1), ("server, 1 user", 1),
        ("server, 20 users", 20)]
    # 1 request: one read of the weights + 36 tokens of KV at 20 GB/s (the FLOPs take less)
    one = 1000 * 269_860_608 / 20e9
    # 20 requests: one read + 20 KV caches (14.3 ms) against 20 x 271 MFLOP at 1 TFLOP/s (5.4 ms)
    twenty = 1000 * (269_031_168 + 20 * 36 * 23_040) / 20e9
    expected = [(one, 30.0, 1000 * 2.5 / 50), (one, 30.0, 1000 * 1.7 / 50), (one, 30.0, 50.0),
                (twenty, 60.0, 100.0)]
    for g, (ceiling_ms, floor_ms, step_ms) in zip(rungs, expected):
        assert g.ceiling_ms == pytest.approx(ceiling_ms, rel=1e-12)
        assert g.floor_ms == pytest.approx(floor_ms, rel=1e-12)
        assert g.step_ms == pytest.approx(step_ms, rel=1e-12)
        assert g.library_ms == pytest.approx(floor_ms - ceiling_ms, rel=1e-12)
        assert g.engine_ms == pytest.approx(step_ms - floor_ms, rel=1e-12)
        assert g.engine_pct == pytest.approx(100 * (step_ms - floor_ms) / step_ms, rel=1e-12)
    # HF: 16.5 ms of library against 20 ms of engine; vLLM: 16.5 against 4
    assert [g.larger_gap for g in rungs] == ["engine", "library", "engine", "library"]


def test_no_rungs_without_a_floor_for_this_model_dtype_and_batches():
    measured = rung_steps()
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    for floor in (None,
                  machine.KernelFloor("float32", 2, cost.matmul_params, {1: 0.03, 20: 0.06}),
                  machine.KernelFloor("bfloat16", 2, cost.matmul_params + 1, {1: 0.03, 20: 0.06}),
                  machine.KernelFloor("bfloat16", 2, cost.matmul_params, {1: 0.03})):
        assert rl.place(measured, cost, MACHINE, context=36, floor=floor).rungs == []


def alone(level: tuple, sequential: tuple | None) -> Alone:
    """Task 6's one request alone: (median, low, high) tok/s of its 1-user level's 3 passes and
    of its 20 sequential requests."""
    seq = measure.Spread(*sequential, 20) if sequential else None
    return Alone(measure.Spread(*level, 3), seq, LEVEL, level[0], 1.5, 0.03)


def test_ways_take_turns_and_the_median_pass_is_kept_whole():
    """in_turns: round 0 untimed unless the caller warmed up; the ways alternate. median_pass and
    Spread.of agree on an even count: the lower middle, never a mean of two passes."""
    calls = []
    ways = {name: (lambda name=name: calls.append(name) or len(calls)) for name in ("a", "b")}
    assert measure.in_turns(ways, 2) == {"a": [3, 5], "b": [4, 6]}      # calls 1, 2: round 0
    calls.clear()
    assert measure.in_turns(ways, 2, warm_up=False) == {"a": [1, 3], "b": [2, 4]}
    assert calls == ["a", "b", "a", "b"]
    passes = [("p1", 40.0), ("p2", 10.0), ("p3", 30.0), ("p4", 20.0)]
    assert measure.median_pass(passes, lambda p: p[1]) == ("p4", 20.0)
    assert measure.Spread.of(p[1] for p in passes) == measure.Spread(20.0, 10.0, 40.0, 4)


def test_twins_are_compared_by_their_medians():
    """Each quantity measured twice is compared by its medians (within measure.AGREE_WITHIN),
    never because the ranges touch, and the line says which way it came out."""
    agree = {"task_6_multi_user_load": hand.fill(
        task6.MultiUserLoad, alone=alone((30.0, 28.0, 31.0), (29.0, 25.0, 33.0)))}
    (line,) = printed.twins(agree)
    assert_says(line, "30.0 against 29.0 tok/s", "divides by the 1-user level",
                branch="they agree", not_branch="DISAGREE")
    # the EPYC's run of the issue: 46.6 against 38.6, the ranges touching: 1.21x apart
    apart = {"task_6_multi_user_load": hand.fill(
        task6.MultiUserLoad, alone=alone((46.6, 37.4, 48.7), (38.6, 36.0, 40.1)))}
    (line,) = printed.twins(apart)
    assert_says(line, "46.6 against 38.6 tok/s", "1.21x apart", branch="they DISAGREE",
                not_branch="they agree")
    # task 9's ratio against task 13's on the same workload: 1.46 against 1.42 agree; 1.70
    # against 1.32 (the issue's run) do not, and the line says which engine moved
    nine = SimpleNamespace(engine_over_vllm_spread=measure.Spread(1.46, 1.40, 1.50, 3),
                           vllm=SimpleNamespace(tokens_per_s=327.6),
                           best=SimpleNamespace(tokens_per_s=588.4))

    def with_13(ratio: float, mini: float = 430.0) -> list[str]:
        eager = SimpleNamespace(workload_tokens_per_s=327.0, mini_tokens_per_s=mini,
                                one_tokens_per_s=None)
        return printed.twins({"task_9_build_your_own_engine": nine,
                              "task_13_compiled_step": SimpleNamespace(
                                  over_vllm=lambda mode: ratio, vllm={"eager": eager})})
    (line,) = with_13(1.42)
    assert_says(line, "1.46x against 1.42x", branch="they agree",
                not_branch=("DISAGREE", "mini_engine made"))
    nine.engine_over_vllm_spread = measure.Spread(1.70, 1.65, 1.75, 3)
    (far,) = with_13(1.32)
    assert_says(far, "1.70x against 1.32x", "1.29x apart", "mini_engine made 588.4 against 430.0",
                "1.37x apart", "vLLM 327.6 against 327.0", branch=("they DISAGREE",
                "they agree"), not_branch="inside")
    assert printed.twins({}) == []                         # nothing ran: no line


def test_every_twin_of_the_issue_is_compared():
    """vLLM offline for one request in tasks 2, 13 and 15 (36.7, 45.9, 60.4: 1.65x apart);
    one user and 20 users through vLLM's server in tasks 6 and 15; 10 users in task 6 and task
    7's config A (244.2 against 179.3: 1.36x apart)."""
    fifteen = task_15_record()
    vllm = fifteen.server("vLLM")
    vllm.offline[0].tokens_per_s = measure.Spread(60.4, 59.0, 61.0, 3)
    two = hand.fill(task2.VLLMInference, generated_tokens=50,
                    pass_times_s=[50 / 36.7, 50 / 36.0, 50 / 37.0])
    thirteen = SimpleNamespace(over_vllm=lambda mode: None, vllm={"eager": SimpleNamespace(
        one_tokens_per_s=45.9)})
    n = fifteen.largest
    six = hand.fill(task6.MultiUserLoad, levels=[level(1, 40.0), level(10, 244.2),
                                                 level(n, 352.0)],
                    spreads=[measure.Spread(40.0, 39.0, 41.0, 3),
                             measure.Spread(244.2, 240.0, 250.0, 3),
                             measure.Spread(352.0, 340.0, 360.0, 3)])
    config_a = hand.fill(task7_record.ConfigRun, level=level(10, 179.3),
                         spread=measure.Spread(179.3, 175.0, 181.0, 3))
    seven = hand.fill(task7_record.Tuning, configs=[config_a])
    lines = printed.twins({"task_2_vllm_inference": two, "task_13_compiled_step": thirteen,
                           "task_15_serve_your_engine": fifteen,
                           "task_6_multi_user_load": six, "task_7_tuning": seven})
    offline, one, many, ten = lines           # task 15's door is two ways: the next test
    assert_says(offline, "task 2 / task 13 / task 15", "36.7, 45.9 and 60.4 tok/s",
                "1.65x apart", branch="DISAGREE")
    one_15, many_15 = vllm.spread(1).median, vllm.spread(n).median
    assert_says(one, "1 user through vLLM's server", f"40.0 against {one_15:.1f}",
                branch=("they agree" if measure.within(40.0, one_15) else "DISAGREE"))
    assert_says(many, f"{n} users through", f"352.0 against {many_15:.1f}",
                branch=("they agree" if measure.within(352.0, many_15) else "DISAGREE"))
    assert_says(ten, "10 users", "config A", "244.2 against 179.3 tok/s", "1.36x apart",
                branch="DISAGREE", not_branch="they agree")


def test_task_15_measures_what_the_server_adds_to_one_request():
    """Task 15's vLLM at 1 user, served 40.0 against offline 40.0 (35-45 and 35-45): 1.00x
    (35/45 = 0.78 to 45/35 = 1.29): nothing measurable; offline 50 (49-51) against served 40
    (39-41): 0.80x (0.76-0.84), a cost."""
    fifteen = task_15_record()
    fifteen.servers[0].offline[0].tokens_per_s = measure.Spread(40.0, 35.0, 45.0, 3)
    fifteen.servers[0].spreads[0] = measure.Spread(40.0, 35.0, 45.0, 3)
    door = printed.front_door(fifteen.servers[0], 1)
    assert_says(door, "task 15", "against 40.0 tok/s", "1.00x", "(0.78-1.29)",
                branch="added nothing measurable",
                not_branch=("cost one request", "was the faster"))
    fifteen.servers[0].offline[0].tokens_per_s = measure.Spread(50.0, 49.0, 51.0, 3)
    fifteen.servers[0].spreads[0] = measure.Spread(40.0, 39.0, 41.0, 3)
    door = printed.front_door(fifteen.servers[0], 1)
    assert_says(door, "0.80x", "(0.76-0.84)", branch="cost one request 20% of its speed",
                not_branch="added nothing measurable")


def test_the_servers_one_user_step_is_task_6s_baseline():
    """Where task 6's two figures of one request alone disagree, the roofline places the one
    its scaling divided by (the sequential requests), not the 1-user level."""
    six = hand.fill(task6.MultiUserLoad, levels=[level(1, 14.7, 0.068), level(20, 300.0, 0.064)],
                    scaling_factor=8.8)
    six.alone = Alone(measure.Spread(14.7, 14.0, 15.0, 3), measure.Spread(34.0, 33.0, 35.0, 20),
                      "the sequential requests", 34.0, 1.47, 0.029)
    one, top = summary.measured_steps({"task_6_multi_user_load": six})
    assert (one.label, one.tokens_per_s, one.step_ms) == ("server, 1 user", 34.0, 29.0)
    assert one.step_from == "measured TPOT, the sequential requests"
    assert (top.users, top.step_ms) == (20, 64.0)
    six.alone = None                                # an older result: the 1-user level
    one, _ = summary.measured_steps({"task_6_multi_user_load": six})
    assert (one.tokens_per_s, one.step_ms) == (14.7, 68.0)


# summary.front_text's two branches: the client's step the longer, or the core's
ADDED, NOTHING_ADDED = "streaming and HTTP added", "the front added nothing measurable"


def split_lines(out: str) -> tuple[str, str]:
    """print_server_split's two lines, 1 user then 20 users, from its output (whitespace
    folded)."""
    _, one_user, users_20 = re.split(r"\b1 user: |\b20 users: ", out)
    return one_user, users_20


def test_the_servers_step_is_split_by_its_engine_cores_own(capsys):
    """Task 6 read vLLM's inter-token latency around each level: the engine core's own step,
    and the client's TPOT beside it; the difference is the API server, streaming and HTTP."""
    top = level(20, 300.0, 0.064)
    top.engine_itl_s = 0.060
    six = hand.fill(task6.MultiUserLoad, levels=[level(1, 34.0, 0.029), top], scaling_factor=8.8)
    six.alone = Alone(measure.Spread(34.0, 33.0, 35.0, 3), None, LEVEL, 34.0, 1.47, 0.029,
                      engine_itl_s=0.025)
    one, twenty = summary.measured_steps({"task_6_multi_user_load": six})
    assert (one.core_ms, twenty.core_ms) == (25.0, 60.0)
    placement = rl.place([one, twenty], machine.model_cost(SMOLLM, "bfloat16", 2), MACHINE, 36)
    printed.print_server_split(placement)
    out = " ".join(capsys.readouterr().out.split())
    assert "in the time to first token" in out
    # core's step, client's, what the front added: 29.0 - 25.0 = 4.0 ms, 16% of 25.0;
    # 64.0 - 60.0 = 4.0 ms, 7% of 60.0
    one_user, users_20 = split_lines(out)
    assert_says(one_user, "25.0 ms", "29.0 ms", "4.0 ms", "(16%)", branch=ADDED,
                not_branch=NOTHING_ADDED)
    assert_says(users_20, "60.0 ms", "64.0 ms", "4.0 ms", "(7%)", branch=ADDED,
                not_branch=NOTHING_ADDED)
    top.engine_itl_s = 0.06402                              # within a tenth: 0.0, never -0.0
    printed.print_server_split(rl.place(summary.measured_steps({"task_6_multi_user_load": six}),
                                        machine.model_cost(SMOLLM, "bfloat16", 2), MACHINE, 36))
    _, users_20 = split_lines(" ".join(capsys.readouterr().out.split()))
    assert_says(users_20, "64.0 ms", "64.0 ms", "added 0.0 ms", "(0%)", branch=ADDED,
                not_branch=(NOTHING_ADDED, "-0.0"))
    top.engine_itl_s = 0.0652                               # the core's gaps the longer
    printed.print_server_split(rl.place(summary.measured_steps({"task_6_multi_user_load": six}),
                                        machine.model_cost(SMOLLM, "bfloat16", 2), MACHINE, 36))
    out = " ".join(capsys.readouterr().out.split())
    one_user, users_20 = split_lines(out)
    assert_says(one_user, "25.0 ms", "29.0 ms", "4.0 ms", branch=ADDED, not_branch=NOTHING_ADDED)
    assert_says(users_20, "65.2 ms", "64.0 ms", "1.2 ms shorter", branch=NOTHING_ADDED,
                not_branch=ADDED)                               # 65.2 - 64.0, never "added -1.2"
    assert "added -" not in out
    top.engine_itl_s = six.alone.engine_itl_s = None        # an external server: no /metrics
    printed.print_server_split(rl.place(summary.measured_steps({"task_6_multi_user_load": six}),
                                        machine.model_cost(SMOLLM, "bfloat16", 2), MACHINE, 36))
    assert capsys.readouterr().out == ""


def test_a_batch_step_shorter_than_one_requests_is_called_suspect(capsys):
    """A step of 20 cannot take less time than a step of 1 on the same server: the roofline's
    text says the 1-user figure is suspect instead of dividing by it."""
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    suspect = "the 1-user figure is suspect"

    def server_step(tpot_20: float) -> str:
        """print_roofline's text from the server's step on: 1 user at 68 ms, 20 at tpot_20."""
        measured = steps_of((15.0, 3.3, 50), (28.0, 1.8, 50),
                            [level(1, 14.7, 0.068), level(20, 300.0, tpot_20)])
        printed.print_roofline(rl.place(measured, cost, MACHINE, context=36), "given")
        return " ".join(capsys.readouterr().out.split()).partition("Here the server's")[2]

    # 1 user 14.7 tok/s at 68 ms, 20 users 300.0 tok/s at 100 ms: 20.4x the tok/s, 1.5x the time
    assert_says(server_step(0.1), "68 ms", "1 request", "100 ms", "20", "20.4x", "1.5x",
                branch="step took", not_branch="suspect")
    assert_says(server_step(0.05), "(68 ms)", "20-user", "(50 ms)", branch=suspect,
                not_branch=("step took", "the tokens/s for"))


def test_the_summarys_insight_is_chosen_by_the_runs_figures():
    """The source's conclusion (1.1x for one request, 12.6x for twenty) tested on this run's,
    with what batching buys any server (transformers' scaling in task 15) apart from what
    vLLM's engine adds beside transformers' server, and paging against what this run's
    batches held."""
    fifteen = task_15_record()
    n = fifteen.largest
    vllm, theirs = fifteen.server("vLLM"), fifteen.server("transformers")
    res = {"task_2_vllm_inference": hand.fill(task2.VLLMInference, speedup=1.04),
           "task_4_paged_attention": hand.fill(task4.PagedKV, users_paged=92,
                                               users_contiguous=19),
           "task_6_multi_user_load": hand.fill(task6.MultiUserLoad, scaling_factor=9.3,
                                               levels=[level(1, 30.0), level(n, 279.0)]),
           "task_15_serve_your_engine": fifteen}
    one, batch, engine, paging = printed.insights(res)
    assert_says(one, "1.0x HuggingFace's", "the source found 1.1x", branch="nothing to batch")
    scale = theirs.spread(n).median / theirs.spread(1).median
    assert_says(batch, f"{n} users at once", "9.3x", f"scaled {scale:.1f}x",
                branch=("most of the gain is batching" if scale >= 0.5 * 9.3 else
                        "more than batching alone"))
    a, b = vllm.spread(n), theirs.spread(n)
    assert_says(engine, f"{a.median:.0f} tok/s", f"transformers' {b.median:.0f}",
                branch=("nothing here tells" if a.overlaps(b) else "what vLLM's engine adds"))
    assert_says(paging, "fit 92 of task 3's requests", "fit 19", not_branch="In task 9")
    # transformers' server scaling 6.5x beside vLLM's 6.9x: most of the gain is batching;
    # 406 against 238 tok/s at 20 users, passes apart: 1.71x is what vLLM's engine adds
    theirs.spreads = [measure.Spread(36.6, 36.0, 37.0, 3) if lv.num_users == 1 else
                      measure.Spread(238.0, 230.0, 240.0, 3) if lv.num_users == n else s
                      for lv, s in zip(theirs.levels, theirs.spreads)]
    vllm.spreads = [measure.Spread(406.0, 400.0, 410.0, 3) if lv.num_users == n else s
                    for lv, s in zip(vllm.levels, vllm.spreads)]
    res["task_6_multi_user_load"].scaling_factor = 6.9
    _, batch, engine, _ = printed.insights(res)
    assert_says(batch, "6.9x", "scaled 6.5x", branch="most of the gain is batching",
                not_branch="more than batching alone")
    assert_says(engine, "406 tok/s", "transformers' 238", "1.71x",
                branch="what vLLM's engine adds", not_branch="nothing here tells")
    theirs.spreads = [measure.Spread(100.0, 99.0, 101.0, 3) if lv.num_users == 1 else s
                      for lv, s in zip(theirs.levels, theirs.spreads)]
    _, batch, _, _ = printed.insights(res)                # 238 / 100 = 2.4x: under half
    assert_says(batch, "scaled only 2.4x", branch="more than batching alone",
                not_branch="most of the gain")
    # task 9's busiest step: 30 of 364 blocks (memory did not bind); 350 of 364 (it did)
    cont = SimpleNamespace(peak_num_pages=30)
    res["task_9_build_your_own_engine"] = SimpleNamespace(
        policies={"continuous": cont}, vllm=SimpleNamespace(num_blocks=364))
    paging = printed.insights(res)[-1]
    assert_says(paging, "held only 30 of 364", branch="not memory, limited",
                not_branch="memory capped")
    cont.peak_num_pages = 350
    paging = printed.insights(res)[-1]
    assert_says(paging, "held 350 of 364 blocks", branch="memory capped that batch",
                not_branch="not memory")
    for line in printed.insights(res):
        assert not re.search(r"\b(a|the) \d+ \w+s left\b", line)
    (nothing_ran,) = printed.insights({})                    # no step's figures: one line
    assert_says(nothing_ran, branch="Run the tasks", not_branch=("users at once", "KV memory"))


# summary.explain_rungs' three branches: the larger gap is the library's, or the rest of the
# step's; or the step beat its floor
LIBRARY = "is the matmul library"
ENGINE = "is the rest of the step, beyond the model's matmuls"
FASTER = "ran faster than the floor"


def parts(text: str, *starts: str) -> list[str]:
    """text cut where each of starts begins, in that order (a start out of order leaves its part
    empty)."""
    at = [text.find(start) for start in starts] + [len(text)]
    assert -1 not in at, f"{starts} not all in {text!r}"
    return [text[a:b] for a, b in zip(at, at[1:])]


def test_the_explanation_is_chosen_by_the_larger_gap():
    library = rl.attribute_step(20.0, 73.0, 85.0, "vLLM, 1 request")
    engine = rl.attribute_step(20.0, 30.0, 85.0, "HF, 1 request")
    text = printed.explain_rungs([library])
    assert_says(text, "vLLM, 1 request:", branch=LIBRARY, not_branch=(ENGINE, FASTER))
    text = printed.explain_rungs([engine])
    # what the rest is was not measured: the text names it as not timed apart, never as the cause
    assert_says(text, "HF, 1 request:", branch=(ENGINE, "was not timed apart here"),
                not_branch=(LIBRARY, FASTER))
    both = printed.explain_rungs([library, engine])
    vllm, hf = parts(both, "vLLM, 1 request:", "HF, 1 request:")
    assert_says(vllm, "vLLM, 1 request:", branch=LIBRARY, not_branch=(ENGINE, FASTER))
    assert_says(hf, "HF, 1 request:", branch=ENGINE, not_branch=(LIBRARY, FASTER))
    faster = rl.attribute_step(50.0, 180.0, 170.0, "server, 20 users")
    text = printed.explain_rungs([faster])
    # a floor the engine beats is no floor: no split, and no gap explained for that step
    assert_says(text, "server, 20 users", branch=(FASTER, "is not split"),
                not_branch=(LIBRARY, ENGINE, "most of the time below the ceiling"))
    assert printed.gaps(faster) == ("-", "-")
    assert printed.gaps(engine) == ("10 (12%)", "55 (65%)")       # 10 / 85, 55 / 85


def test_measure_kernel_floor_times_the_model_shapes():
    tiny = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 128,
            "vocab_size": 1000}
    floor = machine.measure_kernel_floor(tiny, "float32", threads=2, batches=[20, 1, 20])
    assert (floor.dtype, floor.threads) == ("float32", 2)
    assert floor.matmul_params == machine.model_cost(tiny, "float32", 4).matmul_params
    assert sorted(floor.step_s) == [1, 20] and all(t > 0 for t in floor.step_s.values())


def save_rung_results(model_path) -> None:
    """Tasks 1, 2 and 6 as rung_steps, saved with the model folder their config comes from."""
    header = results.RunHeader("m", model_path=str(model_path), dtype="bfloat16")
    hand.save("task_1_hf_baseline", task1.HFBaseline, header, tokens_per_s=20.0,
              total_time_s=2.5, generated_tokens=50, prompt_tokens=11)
    hand.save("task_2_vllm_inference", task2.VLLMInference, header, tokens_per_s=29.41,
              total_time_s=1.7, generated_tokens=50, prompt_tokens=11, speedup=1.5)
    hand.save("task_6_multi_user_load", task6.MultiUserLoad, header,
              levels=[level(1, 20.0, 0.05), level(20, 200.0, 0.1)], scaling_factor=10.0)


def save_machine(floor: machine.KernelFloor | None = None) -> None:
    """results/machine.json as `make lab` saves it, measured on 'learner-vm'."""
    figures = machine.Machine(20e9, {"float32": 250e9, "bfloat16": 1e12}, threads=2,
                              matmul_n={"float32": 1024, "bfloat16": 1024})
    results.save("machine", machine.SavedMachine(machine=figures, kernel_floor=floor,
                                                 host="learner-vm"))


def test_summary_prints_the_rungs_from_the_saved_kernel_floor(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM))
    save_lab_results()
    save_rung_results(model)
    cost = machine.model_cost(SMOLLM, "bfloat16", 2)
    save_machine(machine.KernelFloor("bfloat16", 2, cost.matmul_params, {1: 0.030, 20: 0.060}))
    proc = run_script("summary.py", "--detail")          # the rungs are detail
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = saved_result("summary")["roofline"]
    assert [g["floor_ms"] for g in r["rungs"]] == pytest.approx([30.0, 30.0, 30.0, 60.0],
                                                                rel=1e-12)
    # read back typed, as the report page reads it
    back = results.load("summary", summary.Summary)
    assert [g.floor_ms for g in back.roofline.rungs] == pytest.approx([30.0, 30.0, 30.0, 60.0])
    assert back.roofline.kernel_floor.step_s == {1: 0.030, 20: 0.060}
    out = " ".join(proc.stdout.split())
    assert "WHERE EACH STEP'S TIME GOES" in out
    assert re.search(r"server, 20 users +14\.3 +60\.0 +100\.0 +46 \(46%\) +40 \(40%\)", out)
    # the explanation of the rungs read back, as printed: vLLM and the 20 users' library gaps
    # are the larger (16.5 of 34 ms, 46 of 100), HF's and the 1 user's engine gaps (20 of 50)
    text = printed.explain_rungs(back.roofline.rungs)
    assert text in out
    library, engine = parts(text, "vLLM, 1 request and server, 20 users:",
                            "HF, 1 request and server, 1 user:")
    assert_says(library, "vLLM, 1 request and server, 20 users:", branch=LIBRARY,
                not_branch=(ENGINE, FASTER))
    assert_says(engine, "HF, 1 request and server, 1 user:", branch=ENGINE,
                not_branch=(LIBRARY, FASTER))


# --- the summary table from saved results -----------------------------------------------------
# The figures the summary's table shows for the steps save_lab_results saves with figures of its
# own (the roofline's tests above use them too); every other step's: its hand-built record's
# (tests/hand/), or how to run it.
OWN_ROWS = {
    "verify_environment": "5/5 passed",
    "task_1_hf_baseline": "21.0 tok/s",
    "task_2_vllm_inference": "28.0 tok/s (1.3x)",
    "task_3_kv_cache_problem": "utilisation 20.3%",
    "task_4_paged_attention": "utilisation 95.4%, users 4.8x",
    "task_6_multi_user_load": "20 users 194.4 tok/s (9.8x)",
    "task_7_tuning": "A 149.3 / B 142.3 / C 91.5 tok/s",
    "task_8_dashboard": "20 sent: 8 running, 12 waiting, 61.0 tok/s, KV 36%",
}


def save_lab_results(model: str = "SmolLM2-135M-Instruct", dtype: str = "bfloat16") -> None:
    """Every step's hand-built record (tests/hand/), then, over some of them, the steps of
    OWN_ROWS with figures of their own; all under one header."""
    header = results.RunHeader(model, dtype=dtype)
    hand.save_all(header)
    hand.save("verify_environment", verify_environment.EnvironmentCheck, header, passed=5,
              total=5, machine=hand.fill(verify_environment.LabMachine, cores=7, cpu="Test CPU"))
    hand.save("task_1_hf_baseline", task1.HFBaseline, header, tokens_per_s=21.04)
    hand.save("task_2_vllm_inference", task2.VLLMInference, header, tokens_per_s=27.96,
              speedup=1.33)
    hand.save("task_3_kv_cache_problem", task3.ContiguousKV, header, utilization_pct=20.3)
    hand.save("task_4_paged_attention", task4.PagedKV, header,
              paged=hand.fill(task4.PagedFigures, utilization_pct=95.4), users_ratio=4.8)
    hand.save("task_6_multi_user_load", task6.MultiUserLoad, header,
              levels=[level(1, 19.8), level(20, 194.4)], scaling_factor=9.82)
    hand.save("task_7_tuning", task7.Tuning, header, configs=[
        hand.fill(task7.ConfigRun, config=config, level=level(10, tok_s))
        for config, tok_s in zip(task7.CONFIGS, (149.3, 142.3, 91.5))])
    hand.save("task_8_dashboard", task8.Dashboard, header,
              snapshot=hand.fill(task8.Snapshot, num_running=8, num_waiting=12,
                                 kv_usage_fraction=0.3636),
              last_interval=hand.fill(task8.Interval, tokens_per_s=61.04),
              load=hand.fill(task8.LoadSent, num_requests=20))


def test_every_hand_record_gives_the_row_its_module_declares():
    """What the lab-wide tests expect of each hand-built record's row (tests/hand/<step>.py:
    SUMMARY_ROW) is what its script's summary_row makes of it."""
    by_name = steps.by_name()
    rows = {name: by_name[name].row(record) for name, record in hand.records().items()}
    assert rows == {name: module.SUMMARY_ROW for name, module in hand.modules().items()}
    assert rows


def test_summary_rows_from_saved_results():
    save_lab_results()
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = saved_result("summary")["rows"]
    rows = [(r["step"], r["what"], r["figure"]) for r in saved]
    # the source's own figure beside each step's, where the source has one (its section 10)
    assert [r["source"] for r in saved] == [step.source or "-" for step in steps.STEPS]
    assert "[11.9 tok/s (1.1x)]" in " ".join(proc.stdout.split())
    # each step's: its own figure above, else its hand-built record's, else how to run it
    modules = hand.modules()
    assert rows == [
        (step.number, step.title, OWN_ROWS.get(step.name) or (
            modules[step.name].SUMMARY_ROW if step.name in modules
            else f"not run yet: python {step.script}"))
        for step in steps.STEPS]
    assert rows[5] == ("5", "OpenAI-compatible server", "not run yet: python task_5_api_server.py")
    assert_says(row_value(proc.stdout, "Model, dtype"), "SmolLM2-135M-Instruct", "bfloat16")
    # the machine the lab ran on, from its results (the other way: test_the_machine_is_...)
    assert_says(row_value(proc.stdout, "Cores (threads)"), "7", not_branch="this machine")
    assert_says(row_value(proc.stdout, "CPU"), "Test CPU", not_branch="this machine")
    assert "Measured:" in proc.stdout
    # task 2's speedup 1.33 and task 6's scaling 9.82 beside the source's, in the insight
    note = " ".join(proc.stdout.split()).partition("KEY INSIGHT:")[2]
    assert_says(note, "1.3x HuggingFace's", "the source found 1.1x", "9.8x",
                "the source found 12.6x")
    assert_fits(proc.stdout)
    assert "NOTE" not in proc.stdout


def test_the_machine_is_the_labs_where_it_was_saved_else_this_ones(capsys):
    """print_what_ran's two ways: the machine verify_environment saved, the one the lab ran on;
    without that result, the machine printing the summary, said so."""
    check = hand.fill(verify_environment.EnvironmentCheck, machine=hand.fill(
        verify_environment.LabMachine, cores=7, cpu="Test CPU"))
    record = summary.Summary()
    printed.print_what_ran({"verify_environment": check}, record)
    out = capsys.readouterr().out
    assert_says(row_value(out, "Cores (threads)"), "7", not_branch="this machine")
    assert_says(row_value(out, "CPU"), "Test CPU", not_branch="this machine")
    assert record.cores == 7
    printed.print_what_ran({}, record)
    out = capsys.readouterr().out
    assert_says(row_value(out, "Cores (threads)"), str(settings.num_cores()),
                branch="(this machine)")
    assert_says(row_value(out, "CPU"), settings.cpu_model_name(), branch="(this machine)")
    assert record.cores == settings.num_cores()


def test_an_older_or_broken_result_says_to_run_its_task_again():
    """A result this lab cannot read is one clear line naming the file and the task to run
    again, never a silent "incomplete" and never a traceback."""
    save_lab_results()
    path7 = results.path_of("task_7_tuning")       # this lab's layout, a field missing
    saved7 = json.loads(path7.read_text())
    del saved7["configs"]
    path7.write_text(json.dumps(saved7))
    path6 = results.path_of("task_6_multi_user_load")   # an older lab: no layout version
    path6.write_text(json.dumps({"levels": [{"users": 1, "throughput_tok_s": 19.8}],
                                 "scaling_factor": 1.0}))
    results.path_of("task_1_hf_baseline").write_text("{not json")
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    rows = {r["step"]: r["figure"] for r in saved_result("summary")["rows"]}
    assert (rows["1"], rows["6"], rows["7"]) == ("older result: run task 1 again",
                                                  "older result: run task 6 again",
                                                  "older result: run task 7 again")
    out = "".join(proc.stdout.split())   # a long path is cut where the report's width ends
    for line in (f"NOTE: {path6} was written by an older lab: run task 6 again",
                 f"NOTE: {results.path_of('task_7_tuning')} was written by an older lab "
                 f"(Tuning: no 'configs'): run task 7 again",
                 f"NOTE: {results.path_of('task_1_hf_baseline')} is broken (JSONDecodeError): "
                 f"run task 1 again"):
        assert "".join(line.split()) in out
    assert "incomplete" not in out
    with pytest.raises(results.StaleResult, match="^.*task_6_multi_user_load.json was written "
                                                  "by an older lab: run task 6 again$"):
        results.load("task_6_multi_user_load", task6.MultiUserLoad, "task 6")


def test_roofline_is_placed_with_the_saved_machine_figures(tmp_path):
    """No measuring here: the machine figures saved by the lab are used, so a grader sees the
    learner's ceilings."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOLLM))
    save_lab_results()
    header = results.RunHeader("m", model_path=str(model), dtype="bfloat16")
    hand.save("task_2_vllm_inference", task2.VLLMInference, header, tokens_per_s=27.96,
              speedup=1.33, prompt_tokens=11, generated_tokens=50)
    hand.save("task_6_multi_user_load", task6.MultiUserLoad, header, scaling_factor=9.8,
              levels=[level(1, 20.0, 0.05), level(20, 200.0, 0.1)])
    save_machine()
    proc = run_script("summary.py", "--detail")        # each step placed: detail
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = saved_result("summary")["roofline"]
    # context 11 + 50 // 2 = 36 tokens: the figures of test_ceilings_on_given_inputs
    assert r["context"] == 36 and r["bytes_per_token"] == 269_860_608
    assert r["bandwidth_ceiling_tok_s"] == pytest.approx(20e9 / 269_860_608, rel=1e-12)
    assert_fits(proc.stdout)
    out = " ".join(proc.stdout.split())   # the report wraps long values at 65 columns
    assert "on learner-vm" in out
    # 20 GB/s / 269,860,608 B; 1 TFLOP/s / 271,448,064 FLOPs (test_ceilings_on_given_inputs)
    assert_says(out.partition("1-request ceiling (tok/s):")[2], "74.1")
    assert_says(out.partition("Compute ceiling (tok/s):")[2], "3,684", "bfloat16")
    assert "vLLM, 1 request: 27.96 tok/s" not in out
    assert "  vLLM, 1 request:                28.0 tok/s = 38% of the" in proc.stdout
    # one request against the bandwidth ceiling (28.0 / 74.1), a batch against the compute
    # ceiling (200.0 / 3,684)
    one = re.search(r"vLLM, 1 request: [^:]* ceiling", out).group()
    assert_says(one, "28.0 tok/s", "38%", branch="bandwidth ceiling", not_branch="compute")
    batch = re.search(r"server, 20 users: [^:]* ceiling", out).group()
    assert_says(batch, "200.0 tok/s", "5.4%", branch="compute ceiling", not_branch="bandwidth")
    # the server's measured step: 50 ms for 1 request, 100 ms for 20 (10x the tok/s, 2x the time)
    # (the other way, a 20-user step the shorter: test_a_batch_step_shorter_than_...)
    server = out.partition("Here the server's")[2]
    assert_says(server, "50 ms", "1 request", "100 ms", "20", "10.0x", "2.0x", branch="step took",
                not_branch="suspect")


def test_summary_flags_steps_that_ran_another_model():
    save_lab_results()
    hand.save("task_1_hf_baseline", task1.HFBaseline,
              results.RunHeader("/models/other", dtype="float32"), tokens_per_s=15.0)
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0
    assert "NOTE: task_1_hf_baseline ran other, float32" in proc.stdout


def test_summary_shows_time_and_memory_of_the_last_lab_run():
    save_lab_results()
    results.save("lab_run", results.LabRun(total_seconds=250.0, completed=True, steps=[
        results.LabStepRun("task_1_hf_baseline.py", 12.5, 1_100_000_000, 1),
        results.LabStepRun("task_6_multi_user_load.py", 70.0, 3_600_000_000, 4)]))
    proc = run_script("summary.py", "--no-roofline")
    assert proc.returncode == 0
    assert_says(row_value(proc.stdout, "Largest peak memory (GB)"), "3.60",
                "task_6_multi_user_load", "budget 3.5", branch="OVER in")
    assert "task_1_hf_baseline.py" not in proc.stdout           # the steps' table is detail
    proc = run_script("summary.py", "--no-roofline", "--detail")
    assert re.search(r"\ntask_1_hf_baseline.py +12.5 +1.10 +1\n", proc.stdout)
    assert re.search(r"\ntask_6_multi_user_load.py +70.0 +3.60 OVER +4\n", proc.stdout)
    assert "Last make lab (min):              4.2" in proc.stdout
    assert_fits(proc.stdout)


# --- peak memory --------------------------------------------------------------------------------
HOLD = "import sys, time; b = bytearray({n} * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); " \
       "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(1.5)"


def test_peak_memory_counts_the_children_too():
    code = (f"import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', "
            f"{HOLD.format(n=200)!r}]); " + HOLD.format(n=100) + "; child.wait()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    with memory.PeakMemory(proc.pid, interval_s=0.05) as peak:
        proc.wait()
    # 300 MiB touched by the two processes, plus two Python interpreters (~10 MB each)
    assert 300 * 2**20 < peak.peak_bytes < 300 * 2**20 + 100e6
    assert peak.peak_processes == 2 and peak.num_samples > 5


def test_pss_is_read_only_where_the_peak_can_move():
    """A process that holds 100 MiB, then 200: the peak is the second, yet PSS (a walk of every
    page, the costly reading) is read where the RSS rose, not at every sample."""
    touch = "b{i} = bytearray(100 * 2**20); b{i}[::4096] = b'x' * len(b{i}[::4096]); "
    code = "import time; " + touch.format(i=1) + "time.sleep(2); " + touch.format(i=2) + \
        "time.sleep(2)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    with memory.PeakMemory(proc.pid, interval_s=0.05) as peak:
        proc.wait()
    # the last reading may come up to RSS_STEP_BYTES before the top
    assert 200 * 2**20 - memory.RSS_STEP_BYTES < peak.peak_bytes < 200 * 2**20 + 60e6
    # each reading but the first follows a rise of 8 MiB: the interpreter's and the two arrays'
    # growth (about 210 MiB), however fast it came; the 4 s held steady are about 80 samples
    assert 2 <= peak.num_pss_readings <= 1 + 210 * 2**20 // memory.RSS_STEP_BYTES
    assert peak.num_pss_readings < peak.num_samples // 2


def test_pss_of_a_gone_process_is_zero():
    assert memory.pss_bytes(2**22 + 12345) == 0


def test_lab_run_refuses_bad_flags():
    proc = run_script("lab.py", "--port", "x")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("'x' is not a whole number (see --help)")


def test_peak_memory_counts_the_lab_server_an_earlier_step_started(tmp_path, monkeypatch):
    """A server started by task 5 is no child of task 6, yet task 6's peak includes it: it is
    found through its state file server-<port>.json, as the lab server is."""
    monkeypatch.setenv("LAB_SERVER_DIR", str(tmp_path))
    # what the lab checks before it counts a process group as its server: the command line
    fake_server = subprocess.Popen([sys.executable, "-c", HOLD.format(n=150).replace("1.5", "5"),
                                    "vllm.entrypoints.openai.api_server", "--port", "8123"],
                                   stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert fake_server.stdout.readline() == b"ready\n"
        (tmp_path / "server-8123.json").write_text(f'{{"pid": {fake_server.pid}}}')
        step = subprocess.Popen([sys.executable, "-c", HOLD.format(n=50)], stdout=subprocess.PIPE)
        with memory.PeakMemory(step.pid, server_port=8123, interval_s=0.05) as with_server:
            step.wait()
        step = subprocess.Popen([sys.executable, "-c", HOLD.format(n=50)], stdout=subprocess.PIPE)
        with memory.PeakMemory(step.pid, server_port=8124, interval_s=0.05) as without:
            step.wait()
    finally:
        fake_server.kill()
        fake_server.wait()
    assert 200 * 2**20 < with_server.peak_bytes < 200 * 2**20 + 100e6
    assert with_server.peak_processes == 2
    assert 50 * 2**20 < without.peak_bytes < 50 * 2**20 + 60e6
