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

from common import cli, figures, machine, memory, report, results, settings, steps
from lessons.summary import FIGURES
from lessons.summary import roofline as rl
from lessons.summary.record import Summary

SCRIPT = "summary"
MEMORY_BUDGET_BYTES = 3.5e9   # the source ran in a 4 GB VM; the lab keeps 0.5 GB for the OS
GB = 1e9


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--measure", action="store_true",
                       help="measure this machine's bandwidth, matmul throughput and the "
                            "model's kernel floor again")
    group.add_argument("--no-roofline", action="store_true", help="leave the roofline out")
    return parser.parse_args(argv)


def what_ran(res: dict[str, results.Result]) -> list[tuple[str, str, list[str]]]:
    """(model, dtype, steps that ran it), the most common first; a lab should show one."""
    return results.what_ran({name: r.header for name, r in res.items()})


def print_roofline(r: rl.Placement, measured: str) -> None:
    report.section("ROOFLINE: what bounds decoding on this machine")
    report.paragraph("(the roofline model of Williams, Waterman & Patterson, 2009: speed <= "
                     "min(peak compute, bandwidth x FLOPs per byte))")
    report.row("Machine figures", measured)
    report.row("Memory bandwidth (GB/s)", f"{r.bandwidth_gb_s:.1f} (sum of a "
               f"{machine.BANDWIDTH_MIB} MiB tensor, {r.threads} threads, best of "
               f"{machine.BANDWIDTH_REPEATS}"
               + (f": {r.bandwidth_low_gb_s:.1f}-{r.bandwidth_gb_s:.1f}"
                  if r.bandwidth_low_gb_s else "")
               + "; every step of the run read this one)")
    sizes = r.matmul_n or {}
    gflops = [f"{g:,.0f}" if g >= 100 else f"{g:.2g}"   # 0.3 where bf16 is not native
              for g in (r.matmul_gflop_s["float32"], r.matmul_gflop_s["bfloat16"])]
    report.row("Matmul fp32 / bf16 (GFLOP/s)", f"{gflops[0]} / {gflops[1]} (n x n products, n = "
               f"{sizes.get('float32', '?')} / {sizes.get('bfloat16', '?')})")
    report.row("Model size", f"{r.num_params:,} parameters, {r.dtype}, "
                             f"mean context {r.context} tokens")
    report.row("Bytes read per token (MB)", f"{r.bytes_per_token / 1e6:,.1f} (every weight "
               f"once per step, + its KV cache)")
    report.row("FLOPs per token (MFLOP)", f"{r.flops_per_token / 1e6:,.1f} (2 per weight, "
               f"+ attention)")
    report.row("1-request ceiling (tok/s)", f"{r.bandwidth_ceiling_tok_s:,.1f} = bandwidth / "
               f"bytes per token")
    report.row("Compute ceiling (tok/s)", f"{r.compute_ceiling_tok_s:,.0f} = {r.dtype} "
               f"matmul / FLOPs per token")
    report.row("Bounds cross at (requests)", f"{r.ridge_batch:.0f} in one batch")
    for p in r.placed.values():
        if not p.is_batch:
            report.row(f"  {p.label}", f"{p.tokens_per_s:.1f} tok/s = "
                                       f"{p.pct_of_bandwidth_ceiling:.0f}% of the bandwidth ceiling")
        else:
            at = p.roofline_at_users
            report.row(f"  {p.label}", f"{p.tokens_per_s:.1f} tok/s = "
                                       f"{p.pct_of_compute_ceiling:.1f}% of the compute ceiling")
            report.note(f"(the roofline at {p.users} requests is {at.tokens_per_s:,.0f} tok/s, "
                        f"{at.bound}-bound; measured = {p.pct_of_roofline_at_users:.0f}% of it)",
                        indent=4)
    above = [p.label for p in r.placed.values() if p.pct_of_its_ceiling > 100]
    if above:
        report.paragraph(f"NOTE: {', '.join(above)} ran above its ceiling: the engine's kernels "
                         f"are faster than the benchmark's (e.g. a {r.dtype} matmul without "
                         f"native support); read these ceilings as lower bounds.")
    six = r.placed.get("task_6_multi_user_load")
    text = ("One request reads every weight for each token it makes, so its speed is capped "
            "by memory bandwidth. A batch shares that read: each step reads the weights once "
            "for all its requests, so tokens/s grows with the batch until the matmuls, not the "
            "reads, take the time.")
    if six and six.one_user and six.step_ms >= six.one_user.step_ms:
        one = six.one_user
        text += (f" Here the server's step took {one.step_ms:.0f} ms for 1 request and "
                 f"{six.step_ms:.0f} ms for {six.users}: "
                 f"{six.tokens_per_s / one.tokens_per_s:.1f}x the tokens/s for "
                 f"{six.step_ms / one.step_ms:.1f}x the step time.")
    elif six and six.one_user:   # a step of many cannot be shorter than a step of one
        text += (f" Here the server's 1-user step ({six.one_user.step_ms:.0f} ms) came out "
                 f"longer than its {six.users}-user step ({six.step_ms:.0f} ms): the 1-user "
                 f"figure is suspect (task 6 checks it against its sequential requests).")
    report.paragraph(text)
    print_rungs(r)


def explain_rungs(rungs: list[rl.Rung]) -> str:
    """Where the time below the ceilings goes, chosen per step from which gap is larger."""
    def names(labels: list[str]) -> str:
        return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else labels[0]

    library = [g.label for g in rungs if g.larger_gap == "library"]
    engine = [g.label for g in rungs if g.larger_gap == "engine"]
    below = [g.label for g in rungs if g.engine_ms < 0]
    text = []
    library = [g for g in library if g not in below]
    engine = [g for g in engine if g not in below]
    if library:
        text.append(f"{names(library)}: most of the time below the ceiling is the matmul library. "
                    f"The model's own matmuls alone, on these skinny shapes (a few rows against "
                    f"each weight), run far below this machine's square-matmul peak; the rest of "
                    f"the step is the smaller part.")
    if engine:
        text.append(f"{names(engine)}: most of the time below the ceiling is the rest of the "
                    f"step, beyond the model's matmuls alone. What that rest is (attention, "
                    f"sampling, Python) was not timed apart here; a server's own front (API "
                    f"server, streaming, HTTP) is split off below where its /metrics was read.")
    if below:
        text.append(f"{names(below)} ran faster than the floor: its engine's kernels beat "
                    f"F.linear, so the floor is no floor there and its step is not split.")
    return " ".join(text)


def gaps(g: rl.Rung) -> tuple[str, str]:
    """The library and engine gaps of a step; none where the step beat its floor (no floor)."""
    if g.engine_ms < 0:
        return "-", "-"
    return f"{g.library_ms:.0f} ({g.library_pct:.0f}%)", f"{g.engine_ms:.0f} ({g.engine_pct:.0f}%)"


def print_rungs(r: rl.Placement) -> None:
    """Every measured step on three rungs: the ceiling, the kernel floor, the step."""
    report.section("WHERE EACH STEP'S TIME GOES (ms per decode step)")
    floor = r.kernel_floor
    if not r.rungs:
        report.paragraph("Kernel floor: not measured for this model, dtype and batch sizes. "
                         "`python summary.py --measure`, on the machine the lab ran on, "
                         "measures it with the machine's ceilings.")
        return
    report.table(["Step", "Ceiling", "Floor", "Measured", "Library gap", "Engine gap"],
                 [(g.label, f"{g.ceiling_ms:.1f}", f"{g.floor_ms:.1f}",
                   f"{g.step_ms:.1f}", *gaps(g)) for g in r.rungs],
                 widths=[18, 8, 7, 9, 12, 11])
    report.note("Ceiling: one read of the weights (+ KV) at the measured bandwidth, or the "
                "batch's FLOPs at peak matmul, whichever takes longer.")
    report.note(f"Floor: the model's own linear layers alone (q, k, v, o, gate, up, down per "
                f"layer + LM head), torch {floor.dtype}, {floor.threads} threads, best of "
                f"{machine.FLOOR_REPEATS}.")
    report.note("Library gap = floor - ceiling; engine gap = measured - floor; % of the "
                "measured step.")
    report.paragraph(explain_rungs(r.rungs))
    print_server_split(r)


def front_ms(p) -> float:
    """The client's step less the engine core's: what the server's front adds a token (0.0
    where the two agree to the printed tenth, never a '-0.0')."""
    gap = p.step_ms - p.core_ms
    return 0.0 if abs(gap) < 0.05 else gap


def front_text(p) -> str:
    """What the front added to the pace; a client's pace shorter than the core's (the two
    histograms count slightly different gaps) is said so, not printed as a negative addition."""
    gap = front_ms(p)
    if gap < 0:
        return f"the client's was {-gap:.1f} ms shorter, so the front added nothing measurable"
    return f"the API server, streaming and HTTP added {gap:.1f} ms a token " \
           f"({100 * gap / p.core_ms:.0f}%)"


def print_server_split(r: rl.Placement) -> None:
    """The server's step split where task 6 read its engine core's own step from /metrics: the
    core's part, and what the API server, streaming and HTTP add to what the client sees."""
    six = r.placed.get("task_6_multi_user_load")
    split = [("1 user", six.one_user), (f"{six.users} users", six)] if six else []
    lines = [f"{label}: the engine core's own step {p.core_ms:.1f} ms, the client's "
             f"{p.step_ms:.1f} ms a token: " + front_text(p)
             for label, p in split if p is not None and p.core_ms is not None]
    if lines:
        report.note("The server's step, split by vLLM's own inter-token latency (/metrics). "
                    "This is the pace only: a delay each token pays once on its way (the trip "
                    "through the API server and HTTP) moves every token alike and shows in the "
                    "time to first token, not in the gaps.")
        for line in lines:
            report.note(line, indent=2)


# --- time and memory of the last `make lab` ---------------------------------------------------
def print_lab_run(run: results.LabRun) -> None:
    how = "`python lab.py --quick`" if run.quick else "`make lab`"
    report.section(f"LAST {how} ({run.measured_at[:16].replace('T', ' ')})")
    report.table(["Step", "Time (s)", "Peak mem (GB)", "Processes"],
                 [(s.script, f"{s.seconds:.1f}", f"{s.peak_memory_bytes / GB:.2f}"
                   + (" OVER" if s.peak_memory_bytes > MEMORY_BUDGET_BYTES else ""),
                   s.peak_processes) for s in run.steps],
                 widths=[32, 9, 14, 10])   # the longest script name fits on one line
    report.row("Total time (min)", f"{run.total_seconds / 60:.1f}"
               + (" (--quick: small workloads)" if run.quick else ""))
    if run.steps:
        worst = max(run.steps, key=lambda s: s.peak_memory_bytes)
        report.row("Largest peak (GB)", f"{worst.peak_memory_bytes / GB:.2f} ({worst.script})")
    report.row("Budget (GB)", f"{MEMORY_BUDGET_BYTES / GB:.1f} (the source ran in a 4 GB VM)")
    report.paragraph("Peak memory = PSS of the script, its children and the lab's vLLM server "
                     "(API server, engine core holding the worker, multiprocessing's resource "
                     "tracker): the processes' RSS checked every "
                     f"{memory.SAMPLE_INTERVAL_S:g} s, their PSS read when the RSS rose "
                     f"{memory.RSS_STEP_BYTES >> 20} MiB, and every {memory.PSS_EVERY_S:g} s.")


def print_what_ran(res: dict[str, results.Result], summary: Summary) -> None:
    """The model, dtype, machine and dates the results were measured with (into summary too)."""
    runs = what_ran(res)
    if runs:
        report.row("Model, dtype", f"{runs[0][0]}, {runs[0][1]}")
        for model, dtype, names in runs[1:]:
            report.note(f"  NOTE: {', '.join(names)} ran {model}, {dtype}")
        summary.model, summary.dtype = runs[0][0], runs[0][1]
    check = res.get("verify_environment")
    lab_machine = check.machine if check else None
    if lab_machine:   # the machine the lab ran on, which need not be the one printing this
        report.row("Cores (threads)", lab_machine.cores)
        report.row("CPU", lab_machine.cpu)
    else:
        report.row("Cores (threads)", f"{settings.num_cores()} (this machine)")
        report.row("CPU", f"{settings.cpu_model_name()} (this machine)")
    summary.cores = lab_machine.cores if lab_machine else settings.num_cores()
    dates = sorted(r.measured_at for r in res.values() if r.measured_at)
    if dates:
        report.row("Measured", f"{dates[0][:16].replace('T', ' ')} to "
                               f"{dates[-1][:16].replace('T', ' ')}")
    report.row("Results", settings.results_dir())


def print_table(res: dict[str, results.Result], stale: dict[str, str]
                ) -> list[steps.SummaryRow]:
    report.section("WHAT EACH STEP SHOWED (source, section 10)")
    rows = steps.table_rows(res, stale)
    cells = []
    for r in rows:   # this run's figure, and under it the source's where it has one
        cells.append((r.step, r.what, r.figure))
        if r.source != "-":
            cells.append(("", "", f"(source: {r.source})"))
    report.table(["Step", "What it showed", "Measured"], cells, widths=[5, 26, 34],
                 align_left=(0, 1, 2))
    report.note("Source: the study note's own figures (SmolLM-135M on a 2-core, 4 GB VM).")
    for line in stale.values():
        report.note(f"NOTE: {line}")
    two, six = res.get("task_2_vllm_inference"), res.get("task_6_multi_user_load")
    if two and six and two.speedup is not None:   # else one is not run yet: the table says so
        report.note(f"Single request: {two.speedup:.1f}x (source 1.1x). Concurrent requests: "
                    f"{six.scaling_factor:.1f}x (source 12.6x). Same engine, two faces.")
    return rows


# --- the same thing measured twice in one run -------------------------------------------------
def busy_server(six, fifteen) -> str | None:
    """Task 6's largest level and task 15's same level of vLLM's server: the same requests to the
    same server settings, measured in two steps of the run (None: not both measured)."""
    run = fifteen.server("vLLM") if fifteen else None
    if six is None or run is None or not six.levels or len(six.spreads) != len(six.levels):
        return None
    n = max(lv.num_users for lv in six.levels)
    ours, theirs = six.spreads[[lv.num_users for lv in six.levels].index(n)], run.spread(n)
    if theirs is None:
        return None
    return (f"{n} users through vLLM's server, task 6 {ours.text()} and task 15 "
            f"{theirs.text()} tok/s: " + ("they agree." if ours.agrees(theirs) else
                                          f"they DISAGREE, by {ours.median / theirs.median:.2f}x"
                                          f" (two steps of the run, minutes apart)."))


def front_door(fifteen) -> str | None:
    """Task 15's one request through vLLM's server against its engine offline (None: not
    measured): the same request, minutes apart, so what the server adds, measured apart."""
    run = fifteen.server("vLLM") if fifteen else None
    one = min(fifteen.users) if fifteen else 0
    if run is None or run.door(one) is None:
        return None
    door, span, offline = run.door(one), run.door_range(one), run.offline_at(one)
    inside = span is not None and span[0] <= 1 <= span[1]
    return (f"One request through vLLM's server against LLM.generate, task 15 (the same "
            f"request, minutes apart): {run.level(one).tokens_per_s:.1f} against "
            f"{offline.text()} tok/s, {door:.2f}x"
            + (f" ({span[0]:.2f}-{span[1]:.2f})" if span else "")
            + (": the server added nothing measurable to one request." if inside else
               f": the server cost one request {1 - door:.0%} of its speed." if door < 1 else
               ": the server's request was the faster."))


# Two figures without spreads (one pass, or a best pass) are told apart only past the machine's
# drift: its speed moves by a fifth within minutes (docs/measurements.md).
DRIFT = 0.2


def cross_checks(res: dict[str, results.Result]) -> list[str]:
    """One line per pair of figures this run measured of the same thing: do they agree, and
    which one the lab's figure used. Only pairs whose steps both ran."""
    lines = []
    two, six, nine, thirteen, fifteen = (res.get(name) for name in (
        "task_2_vllm_inference", "task_6_multi_user_load", "task_9_build_your_own_engine",
        "task_13_compiled_step", "task_15_serve_your_engine"))
    door = front_door(fifteen)
    alone = six.alone if six else None
    if alone and alone.sequential:
        verdict = "agree" if alone.agree else "DISAGREE"
        lines.append(f"One request alone, task 6: the 1-user level {alone.level.text()} and "
                     f"the requests one after another {alone.sequential.text(what='requests')} "
                     f"tok/s {verdict}; its scaling divides by {alone.used}.")
    spread = two.tokens_per_s_spread if two else None
    if alone and spread:
        same = spread.agrees(alone.level)
        lines.append(f"One request, task 2 offline (vLLM in-process) {spread.text()} against "
                     f"task 6's 1-user level over HTTP {alone.level.text()} tok/s: "
                     + ("they agree." if same else
                        f"they DISAGREE, by {spread.median / alone.level.median:.2f}x: "
                        + (("the server's request was the slower; what the server adds "
                            "(HTTP, streaming, its loop) " + ("task 15 measured apart (below)."
                                                              if door else
                                                              "was not measured apart."))
                           if spread.median > alone.level.median else
                           "the server's request was the faster; why was not measured.")))
    if door:
        lines.append(door)
    busy = busy_server(six, fifteen)
    if busy:
        lines.append(busy)
    ratio_9 = nine.engine_over_vllm_spread if nine else None
    ratio_13 = thirteen.over_vllm("eager") if thirteen else None
    if ratio_9 and ratio_13:
        inside = ratio_9.low <= ratio_13 <= ratio_9.high
        near = inside or abs(ratio_9.median / ratio_13 - 1) <= DRIFT
        lines.append(f"mini_engine / vLLM eager on task 9's workload: task 9 "
                     f"{ratio_9.text(digits=2, unit='x', what='rounds')} (in turns, vLLM "
                     f"in-process), task 13 {ratio_13:.2f}x (its median round, vLLM in a process "
                     f"of its own): "
                     + ("inside task 9's range." if inside else
                        "within the machine's drift of each other." if near else
                        "more apart than the machine's drift. " + vllm_apart(nine, thirteen)))
    return lines


def vllm_apart(nine, thirteen) -> str:
    """Which side moved between task 9 and task 13: vLLM's own tokens/s in each (task 9 runs it
    in mini_engine's process, task 13 in one of its own, as a server's engine core runs)."""
    eager = thirteen.vllm["eager"]
    in_nine, own = nine.vllm.tokens_per_s, eager.workload_tokens_per_s
    mini_nine, mini_13 = nine.best.tokens_per_s, eager.mini_tokens_per_s
    return (f"vLLM made {in_nine:.1f} tok/s in task 9, in mini_engine's process, and {own:.1f} "
            f"in task 13, in a process of its own ({own / in_nine:.2f}x); mini_engine "
            f"{mini_nine:.1f} and {mini_13:.1f} ({mini_13 / mini_nine:.2f}x). The table's row is "
            "task 9's; task 13's sets mini_engine against vLLM as its server runs it.")


def print_cross_checks(res: dict[str, results.Result], summary: Summary) -> None:
    summary.cross_checks = cross_checks(res)
    if summary.cross_checks:
        report.section("THE SAME THING, MEASURED TWICE IN THIS RUN")
        for line in summary.cross_checks:
            report.note(f"- {line}", hang=2)


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
    print_roofline(summary.roofline, found.source)


def insights(res: dict[str, results.Result]) -> list[str]:
    """The source's conclusion, tested on this run's own figures: what vLLM gave one request
    (task 2) against what a batch gave (task 6), and what paging fit in the same memory
    (task 4). A line only where its steps ran."""
    two, four, six = (res.get(name) for name in ("task_2_vllm_inference",
                                                 "task_4_paged_attention",
                                                 "task_6_multi_user_load"))
    lines = []
    if two and six and six.scaling_factor:
        top = max(six.levels, key=lambda lv: lv.tokens_per_s).num_users
        line = (f"One request: vLLM made {two.speedup:.1f}x HuggingFace's tokens/s (task 2); "
                f"{top} users at once made {six.scaling_factor:.1f}x one request alone (task 6)")
        lines.append(line + (f": as in the source, a batch gained vLLM "
                             f"{six.scaling_factor / two.speedup:.1f}x more than one request did"
                             if six.scaling_factor > two.speedup else
                             ": unlike the source, the batch gained no more than one request "
                             "did on this machine"))
    if four:
        lines.append(f"The same KV memory held {four.users_paged} requests in pages against "
                     f"{four.users_contiguous} allocated contiguously at full length (task 4)"
                     + (": paging is what lets the batch grow"
                        if four.users_paged > four.users_contiguous else
                        ": paging fit no more requests with these lengths"))
    return lines or ["Run the tasks (make lab) for the figures this summary compares"]


def main(argv: list[str] | None = None) -> Summary:
    args = parse_args(argv)
    res, stale = steps.load_all()
    summary = Summary()
    report.title("Summary: the vLLM lab, step by step")
    print_what_ran(res, summary)
    summary.rows = print_table(res, stale)
    print_cross_checks(res, summary)
    if not args.no_roofline:
        roofline_section(res, args.measure, summary)
    if "lab_run" in res:
        print_lab_run(res["lab_run"])
        summary.lab_run = res["lab_run"]
    report.insight(insights(res))
    figures.saved(results.save(SCRIPT, summary), summary, FIGURES)
    return summary


if __name__ == "__main__":
    cli.run(main)
