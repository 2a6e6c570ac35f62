"""What the summary prints: what ran, the source's closing table, the twins (one quantity measured
twice in the run, each pair with its verdict), the roofline, the lab's last run and the KEY
INSIGHT. The roofline's rungs, the server's split and each step's time and memory are detail
(--detail, the report page)."""
from __future__ import annotations

from common import fmt, machine, measure, memory, report, results, settings, steps
from lessons.summary import roofline as rl
from lessons.summary.record import Summary

MEMORY_BUDGET_BYTES = 3.5e9   # the source ran in a 4 GB VM; the lab keeps 0.5 GB for the OS
GB = 1e9
# transformers' own server "gave most of" vLLM's batching gain when its own 1 -> N scaling is at
# least this share of vLLM's: half of it
MOST_OF = 0.5
# the KV cache "capped" a load when the blocks its requests held were at least this share of the
# pool; below it, something else (the requests sent, max_num_seqs) capped the batch
MEMORY_BINDS_AT = 0.9


# --- what ran, and the source's table ---------------------------------------------------------
def print_what_ran(res: dict[str, results.Result], summary: Summary) -> None:
    """The model, dtype, machine and dates the results were measured with (into summary too)."""
    runs = results.what_ran({name: r.header for name, r in res.items()})
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
    with report.detail():
        report.row("Results", settings.results_dir())


def print_table(res: dict[str, results.Result], stale: dict[str, str]
                ) -> list[steps.SummaryRow]:
    report.section("WHAT EACH STEP SHOWED (source, section 10)")
    rows = steps.table_rows(res, stale)
    # this run's figure, the source's after it in square brackets where it has one (as the
    # README's reference table gives it)
    cells = [(r.step, r.what, r.figure + (f" [{r.source}]" if r.source != "-" else ""))
             for r in rows]
    report.table(["", "What it showed", "Measured [source]"], cells, widths=[3, 26, 36],
                 align_left=(0, 1, 2))
    report.note("[source]: the study note's figures (SmolLM-135M, 2 cores, 4 GB).")
    for line in stale.values():
        report.note(f"NOTE: {line}")
    return rows


# --- one quantity measured twice in the run ---------------------------------------------------
def twins(res: dict[str, results.Result]) -> list[str]:
    """One line for each quantity this run measured more than once, with the verdict of its
    medians (within measure.AGREE_WITHIN, common/fmt.py). Only where both steps ran."""
    six, seven, nine, thirteen, fifteen, two = (res.get(name) for name in (
        "task_6_multi_user_load", "task_7_tuning", "task_9_build_your_own_engine",
        "task_13_compiled_step", "task_15_serve_your_engine", "task_2_vllm_inference"))
    vllm_15 = fifteen.server("vLLM") if fifteen else None
    lines = []
    alone = six.alone if six else None
    if alone and alone.sequential:
        lines.append(f"One request alone, task 6's 1-user level and its requests one after "
                     f"another: {fmt.twins(alone.level, alone.sequential, 'tok/s', short=True)}; "
                     f"its scaling divides by {alone.used}.")
    offline = [(f"task {n}", s) for n, s in (
        ("2", two.tokens_per_s_spread if two else None),
        ("13", thirteen.vllm["eager"].one_tokens_per_s
         if thirteen and thirteen.vllm and "eager" in thirteen.vllm else None),
        ("15", vllm_15.offline_at(1) if vllm_15 else None)) if s]
    if len(offline) >= 2:
        lines.append(f"One request to vLLM offline, {' / '.join(n for n, _ in offline)}: "
                     f"{fmt.alike([s for _, s in offline], 'tok/s', short=True)}.")
    for users in (1, 20):
        ours = six_spread(six, users)
        theirs = vllm_15.spread(users) if vllm_15 else None
        if ours and theirs:
            lines.append(f"{users} user{'s' * (users > 1)} through vLLM's server, task 6 and "
                         f"task 15: {fmt.twins(ours, theirs, 'tok/s', short=True)}.")
    config_a = seven.configs[0] if seven and seven.configs else None
    ours = six_spread(six, config_a.level.num_users) if config_a else None
    if ours and config_a.spread:
        lines.append(f"{config_a.level.num_users} users through vLLM's server, task 6 and task "
                     f"7's config A: {fmt.twins(ours, config_a.spread, 'tok/s', short=True)}.")
    ratio_9 = nine.engine_over_vllm_spread if nine else None
    ratio_13 = thirteen.over_vllm("eager") if thirteen else None
    if ratio_9 and ratio_13:
        lines.append(mini_over_vllm(nine, thirteen, ratio_9, ratio_13))
    return lines


def six_spread(six, num_users: int):
    """Task 6's tokens/s at num_users, the spread of its passes (None: not measured)."""
    if six is None or len(six.spreads) != len(six.levels):
        return None
    return next((s for lv, s in zip(six.levels, six.spreads) if lv.num_users == num_users),
                None)


def mini_over_vllm(nine, thirteen, ratio_9, ratio_13: float) -> str:
    """mini_engine over vLLM eager on task 9's workload, in task 9 and in task 13; where they
    disagree, which engine's own tokens/s moved between the two."""
    same = fmt.Twins(ratio_9.median, ratio_13)
    line = (f"mini_engine over vLLM eager on task 9's workload, task 9 and task 13: "
            f"{ratio_9.median:.2f}x against {ratio_13:.2f}x: {same.verdict(short=True)}.")
    if same.agree:
        return line
    eager = thirteen.vllm["eager"]
    mini = fmt.twins(nine.best.tokens_per_s, eager.mini_tokens_per_s, short=True)
    vllm = fmt.twins(nine.vllm.tokens_per_s, eager.workload_tokens_per_s, short=True)
    return line + f" mini_engine made {mini}; vLLM {vllm}. The table's row is task 9's."


def front_door(run, num_users: int) -> str | None:
    """Task 15's request through vLLM's server against its engine offline: two ways, so told
    apart only where their passes are (None: not measured)."""
    door, span, offline = run.door(num_users), run.door_range(num_users), run.offline_at(num_users)
    if door is None or span is None:
        return None
    figures = (f"One request through vLLM's server against LLM.generate (task 15): "
               f"{run.level(num_users).tokens_per_s:.1f} against {offline.median:.1f} tok/s, "
               f"{door:.2f}x ({span[0]:.2f}-{span[1]:.2f})")
    if span[0] <= 1 <= span[1]:
        return figures + ": the server added nothing measurable to one request."
    if door < 1:
        return figures + f": the server cost one request {1 - door:.0%} of its speed."
    return figures + ": the served request was the faster, by more than the passes spread."


def print_twins(res: dict[str, results.Result], summary: Summary) -> None:
    summary.cross_checks = twins(res)
    if summary.cross_checks:
        report.section("THE SAME THING, MEASURED TWICE IN THIS RUN")
        report.note(f"Two figures of one quantity agree when their medians are within "
                    f"{fmt.pct(measure.AGREE_WITHIN)} of each other (tok/s).")
        for line in summary.cross_checks:
            report.note(f"- {line}", hang=2)
    fifteen = res.get("task_15_serve_your_engine")
    run = fifteen.server("vLLM") if fifteen else None
    door = front_door(run, min(fifteen.users)) if run else None
    if door:                 # two ways, not twins: task 15's own report weighs it
        with report.detail():
            report.note(f"- {door}", hang=2)


# --- the roofline -------------------------------------------------------------------------------
def print_roofline(r: rl.Placement, measured: str) -> None:
    report.section("ROOFLINE: what bounds decoding on this machine")
    report.row("Memory bandwidth (GB/s)", f"{r.bandwidth_gb_s:.1f}")
    sizes = r.matmul_n or {}
    gflops = [f"{g:,.0f}" if g >= 100 else f"{g:.2g}"   # 0.3 where bf16 is not native
              for g in (r.matmul_gflop_s["float32"], r.matmul_gflop_s["bfloat16"])]
    report.row("1-request ceiling (tok/s)", f"{r.bandwidth_ceiling_tok_s:,.1f} (bandwidth / "
               f"bytes)")
    report.row("Compute ceiling (tok/s)", f"{r.compute_ceiling_tok_s:,.0f} ({r.dtype} matmul / "
               f"FLOPs)")
    report.row("Machine figures", measured)
    with report.detail():
        report.row("Matmul fp32 / bf16 (GFLOP/s)", f"{gflops[0]} / {gflops[1]}")
        report.paragraph("(the roofline model of Williams, Waterman & Patterson, 2009: speed <= "
                         "min(peak compute, bandwidth x FLOPs per byte))")
        report.row("Bandwidth measured", f"sum of a {machine.BANDWIDTH_MIB} MiB tensor, "
                   f"{r.threads} threads, best of {machine.BANDWIDTH_REPEATS}"
                   + (f": {r.bandwidth_low_gb_s:.1f}-{r.bandwidth_gb_s:.1f}"
                      if r.bandwidth_low_gb_s else ""))
        report.row("Matmul sizes", f"n x n products, n = {sizes.get('float32', '?')} / "
                                   f"{sizes.get('bfloat16', '?')}")
        report.row("Model size", f"{r.num_params:,} parameters, {r.dtype}, "
                                 f"mean context {r.context} tokens")
        report.row("Bytes read per token (MB)", f"{r.bytes_per_token / 1e6:,.1f} (every "
                   f"weight once per step, + its KV cache)")
        report.row("FLOPs per token (MFLOP)", f"{r.flops_per_token / 1e6:,.1f} (2 per weight, "
                   f"+ attention)")
        report.row("Bounds cross at (requests)", f"{r.ridge_batch:.0f} in one batch")
    with report.detail():
        print_placed(r)
    above = [p.label for p in r.placed.values() if p.pct_of_its_ceiling > 100]
    if above:
        report.paragraph(f"NOTE: {', '.join(above)} ran above its ceiling: the engine's kernels "
                         f"are faster than the benchmark's (e.g. a {r.dtype} matmul without "
                         f"native support); read these ceilings as lower bounds.")
    report.paragraph(roofline_text(r))
    with report.detail():
        print_rungs(r)


def print_placed(r: rl.Placement) -> None:
    """Each measured step against its ceiling: one request against the bandwidth's, a batch
    against the compute's and against the roofline at its size."""
    for p in r.placed.values():
        if not p.is_batch:
            report.row(f"  {p.label}", f"{p.tokens_per_s:.1f} tok/s = "
                                       f"{p.pct_of_bandwidth_ceiling:.0f}% of the bandwidth ceiling")
            continue
        at = p.roofline_at_users
        report.row(f"  {p.label}", f"{p.tokens_per_s:.1f} tok/s = "
                                   f"{p.pct_of_compute_ceiling:.1f}% of the compute ceiling")
        report.note(f"(the roofline at {p.users} requests is {at.tokens_per_s:,.0f} tok/s, "
                    f"{at.bound}-bound; measured = {p.pct_of_roofline_at_users:.0f}% of it)",
                    indent=4)


def roofline_text(r: rl.Placement) -> str:
    """Why one request is slow and a batch is not, with the server's own steps where task 6
    measured them."""
    text = ("One request reads every weight for each token it makes, so memory bandwidth caps "
            "its speed. A batch shares that read, so its tokens/s grows until the matmuls take "
            "the time.")
    six = r.placed.get("task_6_multi_user_load")
    if six and six.one_user and six.step_ms >= six.one_user.step_ms:
        one = six.one_user
        return text + (f" Here the server's step took {one.step_ms:.0f} ms for 1 request and "
                       f"{six.step_ms:.0f} ms for {six.users}: "
                       f"{six.tokens_per_s / one.tokens_per_s:.1f}x the tokens/s for "
                       f"{six.step_ms / one.step_ms:.1f}x the step time.")
    if six and six.one_user:   # a step of many cannot be shorter than a step of one
        return text + (f" Here the server's 1-user step ({six.one_user.step_ms:.0f} ms) came "
                       f"out longer than its {six.users}-user step ({six.step_ms:.0f} ms): the "
                       f"1-user figure is suspect (task 6 checks it against its sequential "
                       f"requests).")
    return text


def explain_rungs(rungs: list[rl.Rung]) -> str:
    """Where the time below the ceilings goes, chosen per step from which gap is larger."""
    def names(labels: list[str]) -> str:
        return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else labels[0]

    below = [g.label for g in rungs if g.engine_ms < 0]
    library = [g.label for g in rungs if g.larger_gap == "library" and g.label not in below]
    engine = [g.label for g in rungs if g.larger_gap == "engine" and g.label not in below]
    text = []
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
    how = "lab.py --quick" if run.quick else "make lab"
    with report.detail():
        report.section(f"LAST {how.upper()} ({run.measured_at[:16].replace('T', ' ')})")
        report.table(["Step", "Time (s)", "Peak mem (GB)", "Processes"],
                     [(s.script, f"{s.seconds:.1f}", f"{s.peak_memory_bytes / GB:.2f}"
                       + (" OVER" if s.peak_memory_bytes > MEMORY_BUDGET_BYTES else ""),
                       s.peak_processes) for s in run.steps],
                     widths=[32, 9, 14, 10])   # the longest script name fits on one line
        report.paragraph(f"Peak memory = {report.term('PSS')} of the script, its children and "
                         "the lab's vLLM server, sampled while each step ran (every "
                         f"{memory.SAMPLE_INTERVAL_S:g} s; PSS read when the RSS rose "
                         f"{memory.RSS_STEP_BYTES >> 20} MiB, and every {memory.PSS_EVERY_S:g} s).")
    print()
    report.row(f"Last {how} (min)", f"{run.total_seconds / 60:.1f}"
               + (" (--quick: small workloads)" if run.quick else ""))
    if run.steps:
        worst = max(run.steps, key=lambda s: s.peak_memory_bytes)
        over = [s.script.removesuffix(".py") for s in run.steps
                if s.peak_memory_bytes > MEMORY_BUDGET_BYTES]
        report.row("Largest peak memory (GB)", f"{worst.peak_memory_bytes / GB:.2f} "
                   f"({worst.script.removesuffix('.py')}); budget "
                   f"{MEMORY_BUDGET_BYTES / GB:.1f}" + (f", OVER in {', '.join(over)}" if over else ""))


# --- the KEY INSIGHT ----------------------------------------------------------------------------
def insights(res: dict[str, results.Result]) -> list[str]:
    """The source's conclusion, tested on this run's own figures: what vLLM gave one request
    (task 2); what batching gave, in vLLM's server (task 6) and in transformers' (task 15);
    what vLLM's engine adds beside transformers' server (task 15); what paging fit in the same
    memory (task 4) and whether memory capped this run's batches (task 9). A line only where
    its steps ran."""
    two, four, six, nine, fifteen = (res.get(name) for name in (
        "task_2_vllm_inference", "task_4_paged_attention", "task_6_multi_user_load",
        "task_9_build_your_own_engine", "task_15_serve_your_engine"))
    lines = []
    if two:
        lines.append(f"One request: vLLM made {two.speedup:.1f}x HuggingFace's tokens/s (task 2; "
                     f"the source found 1.1x), with nothing to batch.")
    if six and six.scaling_factor:
        lines.extend(batching(six, fifteen))
    if fifteen:
        lines.extend(engine_beside_transformers(fifteen))
    if four:
        lines.append(paging(four, nine))
    return lines or ["Run the tasks (make lab) for the figures this summary compares."]


def batching(six, fifteen) -> list[str]:
    """What batching bought vLLM's server (task 6), and transformers' own server (task 15)."""
    top = max(six.levels, key=lambda lv: lv.tokens_per_s).num_users
    line = (f"{top} users at once: vLLM's server made {six.scaling_factor:.1f}x one request's "
            f"tokens/s (task 6; the source found 12.6x).")
    theirs = fifteen.server("transformers") if fifteen else None
    one, many = (theirs.spread(n) if theirs else None for n in (1, top))
    if not (one and many and one.median):
        return [line]
    scale = many.median / one.median
    if scale >= MOST_OF * six.scaling_factor:
        return [line + f" transformers' server scaled {scale:.1f}x (task 15): most of the gain "
                       f"is batching, which any batching server gives."]
    return [line + f" transformers' server scaled only {scale:.1f}x (task 15): vLLM's gain is "
                   f"more than batching alone."]


def engine_beside_transformers(fifteen) -> list[str]:
    """vLLM's server against transformers' at the largest level of task 15: what vLLM's engine
    adds beside a server that batches too."""
    n = fifteen.largest
    ours = fifteen.server("vLLM")
    theirs = fifteen.server("transformers")
    a, b = (r.spread(n) if r else None for r in (ours, theirs))
    if not (a and b and b.median):
        return []
    if a.overlaps(b):
        return [f"At {n} users vLLM's server made {a.median:.0f} tok/s, transformers' "
                f"{b.median:.0f} (task 15): their passes overlap, so nothing here tells vLLM's "
                f"engine from transformers'."]
    return [f"At {n} users vLLM's server made {a.median:.0f} tok/s, transformers' "
            f"{b.median:.0f} (task 15): {a.median / b.median:.2f}x, what vLLM's engine adds "
            f"beside a server that also batches."]


def paging(four, nine) -> str:
    """What blocks fit in the same memory (task 4), and whether memory capped this run's batch
    (task 9's busiest step against its pool)."""
    line = (f"Blocks fit {four.users_paged} of task 3's requests where full-length "
            f"reservations fit {four.users_contiguous} (task 4).")
    cont = nine.policies.get("continuous") if nine else None
    pool = nine.vllm.num_blocks if nine and nine.vllm else None
    if not (cont and pool):
        return line
    if cont.peak_num_pages >= MEMORY_BINDS_AT * pool:
        return line + (f" Task 9's busiest step held {cont.peak_num_pages} of {pool} "
                       f"blocks: memory capped that batch, and blocks are what fit more in.")
    return line + (f" Task 9's busiest step held only {cont.peak_num_pages} of {pool}: the "
                   f"batch cap, not memory, limited this run.")
