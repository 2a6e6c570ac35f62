"""The lab's summary: the source's closing table (its section 10), built from what the scripts
measured and saved in results/*.json, with the model, dtype, cores and date they ran with; the
roofline of this machine that explains tasks 1, 2 and 6, each measured step placed on three
rungs (the physical ceiling, the kernel floor of the model's own matmuls, the step); and, after
`make lab`, how long each step took and its peak memory (every process included, the vLLM
server too).

    python summary.py                 # the roofline from results/machine.json (measured once)
    python summary.py --measure       # measure this machine and the kernel floor again first
                                      # (a few seconds)
    python summary.py --no-roofline   # only the saved results

The machine's figures are measured once (`make lab` does it) and saved beside the results, so a
grader's `python summary.py` places the learner's results under the learner's ceilings.
"""
from __future__ import annotations

import json

from common import cli, figures, machine, report, results, settings, steps
from lessons.summary import FIGURES
from lessons.summary import report as printed
from lessons.summary import roofline as rl
from lessons.summary.record import Summary

SCRIPT = "summary"


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--measure", action="store_true",
                       help="measure this machine's bandwidth, matmul throughput and the "
                            "model's kernel floor again")
    group.add_argument("--no-roofline", action="store_true", help="leave the roofline out")
    return parser.parse_args(argv)


# --- the roofline: tasks 1, 2 and 6 under this machine's ceilings ----------------------------
def roofline_inputs(res: dict[str, results.Result]) -> tuple[dict, str, int] | None:
    """(model config, dtype, context) of the run that tasks 1, 2 and 6 measured, or None."""
    one = res.get("task_2_vllm_inference") or res.get("task_1_hf_baseline")
    if not one or not one.header.model_path or not one.header.dtype:
        return None
    try:
        with open(f"{one.header.model_path}/config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if one.prompt_tokens is None or one.generated_tokens is None:
        return None
    # mean context while decoding: the prompt plus half the new tokens
    return config, one.header.dtype, one.prompt_tokens + one.generated_tokens // 2


def in_ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def measured_steps(res: dict[str, results.Result]) -> list[rl.MeasuredStep]:
    """The decode steps tasks 1, 2 and 6 measured. One request: total time / generated tokens
    (the saved tok/s is rounded); the server: task 6's measured time per output token (TPOT),
    the step time while a batch decodes (requests / tok/s where it is missing), at 1 user (the
    baseline task 6's scaling divided by) and at its largest level."""
    out = []
    for name, label in (("task_1_hf_baseline", "HF, 1 request"),
                        ("task_2_vllm_inference", "vLLM, 1 request")):
        one = res.get(name)
        if one and one.tokens_per_s:
            ms = (1000 * one.total_time_s / one.generated_tokens
                  if one.total_time_s and one.generated_tokens else 1000 / one.tokens_per_s)
            out.append(rl.MeasuredStep(name, label, 1, one.tokens_per_s, ms, "time / tokens"))
    six = res.get("task_6_multi_user_load")
    levels = [lv for lv in six.levels if lv.tokens_per_s] if six else []
    if levels:
        def step_ms(lv) -> float:
            return 1000 * (lv.mean_tpot_s or lv.num_users / lv.tokens_per_s)

        top = max(levels, key=lambda lv: lv.num_users)
        low = min(levels, key=lambda lv: lv.num_users)
        alone = six.alone
        if alone and alone.tpot_s and top.num_users > 1:   # the baseline task 6 divided by
            out.append(rl.MeasuredStep("task_6_multi_user_load", "server, 1 user", 1,
                                       alone.tokens_per_s, 1000 * alone.tpot_s,
                                       f"measured TPOT, {alone.used}",
                                       in_ms(alone.engine_itl_s)))
        elif low.num_users == 1 and top.num_users > 1:
            out.append(rl.MeasuredStep("task_6_multi_user_load", "server, 1 user", 1,
                                       low.tokens_per_s, step_ms(low), "measured TPOT"))
        out.append(rl.MeasuredStep("task_6_multi_user_load", f"server, {top.num_users} users",
                                   top.num_users, top.tokens_per_s, step_ms(top),
                                   "measured TPOT", in_ms(top.engine_itl_s)))
    return out


def engine_point(res: dict[str, results.Result], dtype: str) -> rl.EnginePoint | None:
    """Task 9's own engine, continuous batching, on the roofline (when it ran this dtype)."""
    nine = res.get("task_9_build_your_own_engine")
    cont = nine.policies.get("continuous") if nine else None
    if not cont or not cont.num_steps or nine.header.dtype != dtype:
        return None
    return rl.EnginePoint("own engine (task 9), continuous", cont.num_tokens / cont.num_steps,
                          cont.tokens_per_s)


def roofline_section(res: dict[str, results.Result], measure: bool, summary: Summary) -> None:
    """The roofline of this machine with tasks 1, 2 and 6 under it, printed (into summary);
    a note instead without the inputs (task 1 or 2's result and its model's config.json)."""
    inputs = roofline_inputs(res)
    if not inputs:
        print()
        report.note("Roofline: needs task 1 or 2's saved result and the config.json of the "
                    "model it ran (a local folder); run them first.")
        return
    config, dtype, context = inputs
    cost = machine.model_cost(config, dtype)
    steps_measured = measured_steps(res)
    found = machine.machine_figures(config, dtype, rl.floor_batches(steps_measured),
                               settings.num_cores(), measure=measure,
                               measure_floor=True)
    summary.roofline = rl.place(steps_measured, cost, found.machine, context, found.floor)
    summary.engine_point = engine_point(res, dtype)
    printed.print_roofline(summary.roofline, found.source)


def main(argv: list[str] | None = None) -> Summary:
    args = parse_args(argv)
    res, stale = steps.load_all()
    summary = Summary()
    report.title("Summary: the vLLM lab, step by step")
    printed.print_what_ran(res, summary)
    summary.rows = printed.print_table(res, stale)
    printed.print_twins(res, summary)
    if not args.no_roofline:
        roofline_section(res, args.measure, summary)
    if "lab_run" in res:
        printed.print_lab_run(res["lab_run"])
        summary.lab_run = res["lab_run"]
    report.detail_hint()
    report.insight(printed.insights(res))
    figures.saved(results.save(SCRIPT, summary), summary, FIGURES)
    return summary


if __name__ == "__main__":
    cli.run(main)
