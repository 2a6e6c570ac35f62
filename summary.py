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

from common import cli, figures, memory, report, results, settings, steps
from common import roofline as rl

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


def load_all() -> tuple[dict[str, results.Result], dict[str, str]]:
    """Every step's saved result, typed (common.steps: the one list), and the lab's last run;
    with, for each result this lab cannot read, its one line (run it again)."""
    res, stale = {}, {}
    for name in [step.name for step in steps.STEPS] + ["lab_run"]:
        try:
            record = results.load(name)
        except results.StaleResult as e:
            stale[name] = str(e)
            continue
        if record is not None:
            res[name] = record
    return res, stale


# --- the section-10 table ---------------------------------------------------------------------
def table_rows(res: dict[str, results.Result], stale: dict[str, str] | None = None
               ) -> list[tuple[str, str, str]]:
    """(step, what it showed, measured figure) for every step, each built by its entry in
    common/steps.py from its typed result; a step not run says how to run it, one this lab
    cannot read says to run it again."""
    stale = stale or {}
    rows = []
    for step in steps.STEPS:
        if step.name in stale:
            figure = f"older result: run {step.label} again"
        elif step.name not in res:
            figure = f"not run yet: python {step.script}"
        else:
            figure = step.row(res[step.name])
        rows.append((step.number, step.title, figure))
    return rows


def what_ran(res: dict[str, results.Result]) -> list[tuple[str, str, list[str]]]:
    """(model, dtype, steps that ran it), the most common first; a lab should show one."""
    return results.what_ran({name: r.header for name, r in res.items()})


def print_roofline(r: dict, measured: str) -> None:
    report.section("ROOFLINE: what bounds decoding on this machine")
    report.paragraph("(the roofline model of Williams, Waterman & Patterson, 2009: speed <= "
                     "min(peak compute, bandwidth x FLOPs per byte))")
    report.row("Machine figures", measured)
    report.row("Memory bandwidth (GB/s)", f"{r['bandwidth_gb_s']:.1f} (sum of a "
               f"{rl.BANDWIDTH_MIB} MiB tensor, {r['threads']} threads, best of "
               f"{rl.BANDWIDTH_REPEATS})")
    sizes = r.get("matmul_n") or {}
    gflops = [f"{g:,.0f}" if g >= 100 else f"{g:.2g}"   # 0.3 where bf16 is not native
              for g in (r['matmul_gflop_s']['float32'], r['matmul_gflop_s']['bfloat16'])]
    report.row("Matmul fp32 / bf16 (GFLOP/s)", f"{gflops[0]} / {gflops[1]} (n x n products, n = "
               f"{sizes.get('float32', '?')} / {sizes.get('bfloat16', '?')})")
    report.row("Model size", f"{r['num_params']:,} parameters, {r['dtype']}, "
                             f"mean context {r['context']} tokens")
    report.row("Bytes read per token (MB)", f"{r['bytes_per_token'] / 1e6:,.1f} (every weight "
               f"once per step, + its KV cache)")
    report.row("FLOPs per token (MFLOP)", f"{r['flops_per_token'] / 1e6:,.1f} (2 per weight, "
               f"+ attention)")
    report.row("1-request ceiling (tok/s)", f"{r['bandwidth_ceiling_tok_s']:,.1f} = bandwidth / "
               f"bytes per token")
    report.row("Compute ceiling (tok/s)", f"{r['compute_ceiling_tok_s']:,.0f} = {r['dtype']} "
               f"matmul / FLOPs per token")
    report.row("Bounds cross at (requests)", f"{r['ridge_batch']:.0f} in one batch")
    above = []
    for p in r["placed"].values():
        if "pct_of_bandwidth_ceiling" in p:
            pct = p["pct_of_bandwidth_ceiling"]
            report.row(f"  {p['label']}", f"{p['tokens_per_s']:.1f} tok/s = {pct:.0f}% of the "
                                          f"bandwidth ceiling")
        else:
            at, pct = p["roofline_at_users"], p["pct_of_compute_ceiling"]
            report.row(f"  {p['label']}", f"{p['tokens_per_s']:.1f} tok/s = {pct:.1f}% of the "
                                          f"compute ceiling")
            report.note(f"(the roofline at {p['users']} requests is {at['tokens_per_s']:,.0f} tok/s, "
                        f"{at['bound']}-bound; measured = {p['pct_of_roofline_at_users']:.0f}% of it)",
                        indent=4)
        if pct > 100:
            above.append(p["label"])
    if above:
        report.paragraph(f"NOTE: {', '.join(above)} ran above its ceiling: the engine's kernels "
                         f"are faster than the benchmark's (e.g. a {r['dtype']} matmul without "
                         f"native support); read these ceilings as lower bounds.")
    six = r["placed"].get("task_6_multi_user_load", {})
    text = ("One request reads every weight for each token it makes, so its speed is capped "
            "by memory bandwidth. A batch shares that read: each step reads the weights once "
            "for all its requests, so tokens/s grows with the batch until the matmuls, not the "
            "reads, take the time.")
    if "one_user" in six:
        one = six["one_user"]
        text += (f" Here the server's step took {one['step_ms']:.0f} ms for 1 request and "
                 f"{six['step_ms']:.0f} ms for {six['users']}: "
                 f"{six['tokens_per_s'] / one['tokens_per_s']:.1f}x the tokens/s for "
                 f"{six['step_ms'] / one['step_ms']:.1f}x the step time.")
    report.paragraph(text)
    print_rungs(r)


def explain_rungs(rungs: list[dict]) -> str:
    """Where the time below the ceilings goes, chosen per step from which gap is larger."""
    def names(labels: list[str]) -> str:
        return ", ".join(labels[:-1]) + " and " + labels[-1] if len(labels) > 1 else labels[0]

    library = [g["label"] for g in rungs if g["larger_gap"] == "library"]
    engine = [g["label"] for g in rungs if g["larger_gap"] == "engine"]
    below = [g["label"] for g in rungs if g["engine_ms"] < 0]
    text = []
    if library:
        text.append(f"{names(library)}: most of the time below the ceiling is the matmul library. "
                    f"The model's own matmuls alone, on these skinny shapes (a few rows against "
                    f"each weight), run far below this machine's square-matmul peak; the rest of "
                    f"the step (attention, sampling, scheduling, HTTP) is the smaller part.")
    if engine:
        text.append(f"{names(engine)}: most of the time below the ceiling is the rest of the "
                    f"step, beyond the matmuls (attention, sampling, the framework's Python; a "
                    f"server's scheduling and HTTP); the model's matmuls alone are the smaller "
                    f"part.")
    if below:
        text.append(f"{names(below)} ran faster than the floor: its engine multiplies with "
                    f"kernels of its own, so read the floor as an upper bound there.")
    return " ".join(text)


def print_rungs(r: dict) -> None:
    """Every measured step on three rungs: the ceiling, the kernel floor, the step."""
    report.section("WHERE EACH STEP'S TIME GOES (ms per decode step)")
    floor = r.get("kernel_floor")
    if not r.get("rungs"):
        report.paragraph("Kernel floor: not measured for this model, dtype and batch sizes. "
                         "`python summary.py --measure`, on the machine the lab ran on, "
                         "measures it with the machine's ceilings.")
        return
    report.table(["Step", "Ceiling", "Floor", "Measured", "Library gap", "Engine gap"],
                 [(g["label"], f"{g['ceiling_ms']:.1f}", f"{g['floor_ms']:.1f}",
                   f"{g['step_ms']:.1f}", f"{g['library_ms']:.0f} ({g['library_pct']:.0f}%)",
                   f"{g['engine_ms']:.0f} ({g['engine_pct']:.0f}%)") for g in r["rungs"]],
                 widths=[18, 8, 7, 9, 12, 11])
    report.note("Ceiling: one read of the weights (+ KV) at the measured bandwidth, or the "
                "batch's FLOPs at peak matmul, whichever takes longer.")
    report.note(f"Floor: the model's own linear layers alone (q, k, v, o, gate, up, down per "
                f"layer + LM head), torch {floor['dtype']}, {floor['threads']} threads, best of "
                f"{rl.FLOOR_REPEATS}.")
    report.note("Library gap = floor - ceiling; engine gap = measured - floor; % of the "
                "measured step.")
    report.paragraph(explain_rungs(r["rungs"]))


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
                     "tracker), "
                     f"sampled every {memory.SAMPLE_INTERVAL_S:g} s.")


def print_what_ran(res: dict[str, results.Result]) -> dict:
    """The model, dtype, machine and dates the results were measured with; returns them."""
    runs = what_ran(res)
    if runs:
        report.row("Model, dtype", f"{runs[0][0]}, {runs[0][1]}")
        for model, dtype, names in runs[1:]:
            report.note(f"  NOTE: {', '.join(names)} ran {model}, {dtype}")
    check = res.get("verify_environment")
    machine = check.machine if check else None
    if machine:   # the machine the lab ran on, which need not be the one printing this
        report.row("Cores (threads)", machine["cores"])
        report.row("CPU", machine["cpu"])
    else:
        report.row("Cores (threads)", f"{settings.num_cores()} (this machine)")
        report.row("CPU", f"{settings.cpu_model_name()} (this machine)")
    dates = sorted(r.measured_at for r in res.values() if r.measured_at)
    if dates:
        report.row("Measured", f"{dates[0][:16].replace('T', ' ')} to "
                               f"{dates[-1][:16].replace('T', ' ')}")
    report.row("Results", settings.results_dir())
    return {"model": runs[0][0] if runs else None, "dtype": runs[0][1] if runs else None,
            "cores": machine["cores"] if machine else settings.num_cores()}


def print_table(res: dict[str, results.Result], stale: dict[str, str]) -> list[dict]:
    report.section("WHAT EACH STEP SHOWED (source, section 10)")
    rows = table_rows(res, stale)
    report.table(["Step", "What it showed", "Measured"], rows, widths=[5, 26, 34],
                 align_left=(0, 1, 2))
    for line in stale.values():
        report.note(f"NOTE: {line}")
    two, six = res.get("task_2_vllm_inference"), res.get("task_6_multi_user_load")
    if two and six and two.speedup is not None:   # else one is not run yet: the table says so
        report.note(f"Single request: {two.speedup:.1f}x. Concurrent requests: "
                    f"{six.scaling_factor:.1f}x. Same engine, two faces.")
    return [{"step": s, "what": w, "figure": f} for s, w, f in rows]


def roofline_section(res: dict[str, results.Result], measure: bool) -> dict | None:
    """The roofline of this machine with tasks 1, 2 and 6 under it, printed; None without the
    inputs (task 1 or 2's result and its model's config.json)."""
    inputs = rl.roofline_inputs(res)
    if not inputs:
        print()
        report.note("Roofline: needs task 1 or 2's saved result and the config.json of the "
                    "model it ran (a local folder); run them first.")
        return None
    config, dtype, context = inputs
    cost = rl.model_cost(config, dtype)
    found = rl.machine_figures(config, dtype, rl.floor_batches(res), settings.num_cores(),
                               measure=measure, save=True)
    placed = rl.place(res, cost, found.machine, context, found.floor)
    print_roofline(placed, found.source)
    return placed


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    res, stale = load_all()
    report.title("Summary: the vLLM lab, step by step")
    data = print_what_ran(res)
    data["rows"] = print_table(res, stale)
    if not args.no_roofline and (placed := roofline_section(res, args.measure)):
        data["roofline"] = placed
    if "lab_run" in res:
        print_lab_run(res["lab_run"])
        data["lab_run"] = res["lab_run"].to_dict()
    report.insight([
        "vLLM's value is not one fast request: it packs more requests into the same KV memory "
        "(PagedAttention) and runs them as one batch (continuous batching)",
        "A tok/s figure without its concurrency tells half the story",
    ])
    figures.saved(results.save(SCRIPT, data))
    return data


if __name__ == "__main__":
    cli.run(main)
