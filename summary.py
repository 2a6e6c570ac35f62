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
import socket
from dataclasses import asdict

from common import cli, memory, report, results, settings
from common import roofline as rl

SCRIPT = "summary"
STEPS = ["verify_environment", "task_1_hf_baseline", "task_2_vllm_inference",
         "task_3_kv_cache_problem", "task_4_paged_attention", "task_5_api_server",
         "task_6_multi_user_load", "task_7_tuning", "task_8_dashboard",
         "task_9_build_your_own_engine"]
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


def load_all() -> dict[str, dict]:
    return {step: r for step in STEPS + ["lab_run"] if (r := results.load(step)) is not None}


# --- the section-10 table ---------------------------------------------------------------------
def table_rows(res: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(step, what it showed, measured figure) for every step; a step not run says how to run it."""
    def get(step, figure):
        if step not in res:
            return f"not run yet: python {step}.py"
        try:
            return figure(res[step])
        except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError):
            return f"incomplete result: rerun python {step}.py"   # e.g. from an older version

    def tuning(r):
        return " / ".join(f"{c['label'][0]} {c['throughput_tok_s']:.1f}" for c in r["configs"]) \
            + " tok/s"

    def dashboard(r):   # what task 8's snapshot showed: the batch, what waited, the KV cache
        s, interval = r["snapshot"], r["last_interval"]
        sent = f"{r['load']['sent']} sent: " if r.get("load") else ""
        kv = "" if s["kv_usage"] is None else f", KV {100 * s['kv_usage']:.0f}%"
        return (f"{sent}{s['running']} running, {s['waiting']} waiting, "
                f"{interval['tokens_per_s']:.1f} tok/s{kv}")

    def own_engine(r):   # task 9: continuous vs static on the same engine, engine vs vLLM
        parts = [f"{r['correctness']['num_identical']}/{r['correctness']['num_prompts']} = HF"]
        if "continuous_over_static" in r:
            parts.append(f"{r['continuous_over_static']:.2f}x static")
        if "engine_over_vllm" in r:
            parts.append(f"{r['engine_over_vllm']:.2f}x vLLM")
        return ", ".join(parts)

    def peak(r):
        top = max(r["levels"], key=lambda lv: lv["throughput_tok_s"])
        return f"{top['users']} users {top['throughput_tok_s']:.1f} tok/s ({r['scaling_factor']:.1f}x)"

    return [
        ("0", "Environment check", get("verify_environment",
                                       lambda r: f"{r['passed']}/{r['total']} passed")),
        ("1", "HuggingFace baseline", get("task_1_hf_baseline",
                                          lambda r: f"{r['tokens_per_s']:.1f} tok/s")),
        ("2", "vLLM, one request", get("task_2_vllm_inference",
                                         lambda r: f"{r['tokens_per_s']:.1f} tok/s ({r['speedup']:.1f}x)")),
        ("3", "Contiguous KV allocation", get("task_3_kv_cache_problem",
                                                    lambda r: f"utilisation {r['utilization_pct']}%")),
        ("4", "PagedAttention", get("task_4_paged_attention",
                                    lambda r: f"utilisation {r['paged']['utilization_pct']}%, "
                                              f"users {r['users_ratio']}x")),
        ("5", "OpenAI-compatible server", get("task_5_api_server",
                                              lambda r: f"/v1/completions, "
                                                        f"{r['raw_http']['latency_s']:.2f} s")),
        ("6", "Concurrent users", get("task_6_multi_user_load", peak)),
        ("7", "Parameter tuning", get("task_7_tuning", tuning)),
        ("8", "Dashboard over /metrics", get("task_8_dashboard", dashboard)),
        ("9", "Engine built from scratch", get("task_9_build_your_own_engine", own_engine)),
    ]


def what_ran(res: dict[str, dict]) -> list[tuple[str, str, list[str]]]:
    """(model, dtype, steps that ran it), the most common first; a lab should show one."""
    runs: dict[tuple[str, str], list[str]] = {}
    for step, r in res.items():
        if r.get("model") and r.get("dtype"):
            name = r["model"].rstrip("/").rsplit("/", 1)[-1]
            runs.setdefault((name, r["dtype"]), []).append(step)
    return sorted(((model, dtype, steps) for (model, dtype), steps in runs.items()),
                  key=lambda run: -len(run[2]))


# --- the roofline -------------------------------------------------------------------------------
def roofline_inputs(res: dict[str, dict]) -> tuple[dict, str, int] | None:
    """(model config, dtype, context) of the run that tasks 1, 2 and 6 measured, or None."""
    t2 = res.get("task_2_vllm_inference") or res.get("task_1_hf_baseline")
    if not t2 or not t2.get("model_path"):
        return None
    try:
        with open(f"{t2['model_path']}/config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    # mean context while decoding: the prompt plus half the new tokens
    context = t2["prompt_tokens"] + t2["generated_tokens"] // 2
    return config, t2["dtype"], context


def step_ms(level: dict) -> float:
    """A load level's decode step: its measured TPOT (requests / tok/s where it is missing)."""
    if level.get("mean_tpot_s"):
        return 1000 * level["mean_tpot_s"]
    return 1000 * level["users"] / level["throughput_tok_s"]


def floor_batches(res: dict[str, dict]) -> list[int]:
    """The batch sizes the measured steps ran: 1 (tasks 1, 2, task 6's one user) and task 6's
    largest level."""
    users = [lv["users"] for lv in res.get("task_6_multi_user_load", {}).get("levels", [])
             if lv.get("throughput_tok_s")]
    return sorted({1, max(users)}) if users else [1]


def roofline(res: dict[str, dict], cost: rl.ModelCost, machine: rl.Machine, context: int,
             floor: rl.KernelFloor | None = None) -> dict:
    """Tasks 1, 2 and 6 placed under this machine's ceilings (every figure from the inputs), and,
    with the kernel floor, every measured step on three rungs (rl.attribute_step).
    Time per decode step: total time / generated tokens for one request; for the server, task 6's
    measured time per output token (TPOT), which is the step time while a batch decodes."""
    single = rl.ceiling(cost, machine, 1, context)
    top = rl.compute_ceiling(cost, machine, context)
    placed = {}
    for step, label in (("task_1_hf_baseline", "HF, 1 request"),
                        ("task_2_vllm_inference", "vLLM, 1 request")):
        if res.get(step, {}).get("tokens_per_s"):
            r = res[step]
            tps = r["tokens_per_s"]
            # the saved tok/s is rounded: the step from the unrounded time where it is saved
            ms = (1000 * r["total_time_s"] / r["generated_tokens"]
                  if r.get("total_time_s") and r.get("generated_tokens") else 1000 / tps)
            placed[step] = {"label": label, "users": 1, "tokens_per_s": tps,
                            "step_ms": ms, "step_from": "time / tokens",
                            "pct_of_bandwidth_ceiling": 100 * tps / single["tokens_per_s"]}
    levels = [lv for lv in res.get("task_6_multi_user_load", {}).get("levels", [])
              if lv.get("throughput_tok_s")]
    if levels:
        lv = max(levels, key=lambda lv: lv["users"])
        at_batch = rl.ceiling(cost, machine, lv["users"], context)
        placed["task_6_multi_user_load"] = {
            "label": f"server, {lv['users']} users", "users": lv["users"],
            "tokens_per_s": lv["throughput_tok_s"],
            "step_ms": step_ms(lv), "step_from": "measured TPOT",
            "pct_of_compute_ceiling": 100 * lv["throughput_tok_s"] / top,
            "roofline_at_users": at_batch,
            "pct_of_roofline_at_users": 100 * lv["throughput_tok_s"] / at_batch["tokens_per_s"]}
        one = min(levels, key=lambda lv: lv["users"])
        if one["users"] == 1 and lv["users"] > 1:
            placed["task_6_multi_user_load"]["one_user"] = {
                "tokens_per_s": one["throughput_tok_s"], "step_ms": step_ms(one)}
    steps = [(p["label"], p["users"], p["step_ms"]) for p in placed.values()]
    six = placed.get("task_6_multi_user_load", {})
    if "one_user" in six:
        steps.insert(-1, ("server, 1 user", 1, six["one_user"]["step_ms"]))
    rungs = []
    if floor is not None and floor.covers(cost, {users for _, users, _ in steps}):
        for label, users, ms in steps:
            # the ceiling's step: one read of the weights (+ KV) or the batch's FLOPs at peak
            ceiling_ms = 1000 * users / rl.ceiling(cost, machine, users, context)["tokens_per_s"]
            rungs.append({"label": label, "users": users,
                          **rl.attribute_step(ceiling_ms, 1000 * floor.step_s[users], ms)})
    return {"kernel_floor": asdict(floor) if floor else None, "rungs": rungs,
            "bandwidth_gb_s": machine.bandwidth_bytes_s / GB,
            "matmul_gflop_s": {k: v / GB for k, v in machine.flops_s.items()},
            "matmul_n": machine.matmul_n, "threads": machine.threads,
            "dtype": cost.dtype, "context": context,
            "num_params": cost.num_params, "weight_bytes": cost.weight_bytes,
            "weight_read_ms": 1000 * cost.weight_bytes / machine.bandwidth_bytes_s,
            "bytes_per_token": cost.bytes_per_token(context),
            "flops_per_token": cost.flops_per_token(context),
            "bandwidth_ceiling_tok_s": single["tokens_per_s"], "compute_ceiling_tok_s": top,
            "ridge_batch": rl.ridge_batch(cost, machine, context), "placed": placed}


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


def machine_figures(measure: bool, config: dict, dtype: str, batches: list[int]
                    ) -> tuple[rl.Machine, rl.KernelFloor | None, str]:
    """The machine's ceilings and the model's kernel floor: saved in results/machine.json
    (measured once, on the machine the lab ran on), or measured here now and saved."""
    saved = results.load("machine")
    if saved and not measure:
        machine = rl.Machine(saved["bandwidth_bytes_s"], saved["flops_s"], saved["threads"],
                             saved.get("matmul_n"))
        floor = saved.get("kernel_floor")
        if floor:   # JSON keys are strings: the batch sizes back to numbers
            floor = rl.KernelFloor(**floor | {"step_s": {int(b): t for b, t in
                                                         floor["step_s"].items()}})
        return machine, floor, (f"measured {saved['measured_at'][:16].replace('T', ' ')} on "
                                f"{saved['host']}")
    machine = rl.measure_machine(settings.num_cores())
    floor = rl.measure_kernel_floor(config, dtype, settings.num_cores(), batches)
    results.save("machine", asdict(machine) | {"kernel_floor": asdict(floor),
                                                "host": socket.gethostname(),
                                                "cpu": settings.cpu_model_name()})
    return machine, floor, f"measured now on {socket.gethostname()}"


# --- time and memory of the last `make lab` ---------------------------------------------------
def print_lab_run(run: dict) -> None:
    how = "`python lab.py --quick`" if run.get("quick") else "`make lab`"
    report.section(f"LAST {how} ({run['measured_at'][:16].replace('T', ' ')})")
    report.table(["Step", "Time (s)", "Peak mem (GB)", "Processes"],
                 [(s["script"], f"{s['seconds']:.1f}", f"{s['peak_memory_bytes'] / GB:.2f}"
                   + (" OVER" if s["peak_memory_bytes"] > MEMORY_BUDGET_BYTES else ""),
                   s["peak_processes"]) for s in run["steps"]],
                 widths=[32, 9, 14, 10])   # the longest script name fits on one line
    report.row("Total time (min)", f"{run['total_seconds'] / 60:.1f}"
               + (" (--quick: small workloads)" if run.get("quick") else ""))
    worst = max(run["steps"], key=lambda s: s["peak_memory_bytes"])
    report.row("Largest peak (GB)", f"{worst['peak_memory_bytes'] / GB:.2f} ({worst['script']})")
    report.row("Budget (GB)", f"{MEMORY_BUDGET_BYTES / GB:.1f} (the source ran in a 4 GB VM)")
    report.paragraph("Peak memory = PSS of the script, its children and the lab's vLLM server "
                     "(API server, engine core holding the worker, multiprocessing's resource "
                     "tracker), "
                     f"sampled every {memory.SAMPLE_INTERVAL_S:g} s.")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    res = load_all()
    report.title("Summary: the vLLM lab, step by step")
    runs = what_ran(res)
    dates = sorted(r["measured_at"] for r in res.values() if "measured_at" in r)
    if runs:
        report.row("Model, dtype", f"{runs[0][0]}, {runs[0][1]}")
        for model, dtype, steps in runs[1:]:
            report.note(f"  NOTE: {', '.join(steps)} ran {model}, {dtype}")
    machine = res.get("verify_environment", {}).get("machine")
    if machine:   # the machine the lab ran on, which need not be the one printing this
        report.row("Cores (threads)", machine["cores"])
        report.row("CPU", machine["cpu"])
    else:
        report.row("Cores (threads)", f"{settings.num_cores()} (this machine)")
        report.row("CPU", f"{settings.cpu_model_name()} (this machine)")
    if dates:
        report.row("Measured", f"{dates[0][:16].replace('T', ' ')} to {dates[-1][:16].replace('T', ' ')}")
    report.row("Results", settings.results_dir())

    report.section("WHAT EACH STEP SHOWED (source, section 10)")
    rows = table_rows(res)
    report.table(["Step", "What it showed", "Measured"], rows, widths=[5, 26, 34],
                 align_left=(0, 1, 2))
    data = {"rows": [{"step": s, "what": w, "figure": f} for s, w, f in rows],
            "model": runs[0][0] if runs else None, "dtype": runs[0][1] if runs else None,
            "cores": machine["cores"] if machine else settings.num_cores()}
    try:
        report.note(f"Single request: {res['task_2_vllm_inference']['speedup']:.1f}x. "
                    f"Concurrent requests: {res['task_6_multi_user_load']['scaling_factor']:.1f}x. "
                    "Same engine, two faces.")
    except (KeyError, TypeError, ValueError):
        pass   # one of the two is not run yet: the table says so

    inputs = roofline_inputs(res)
    if not args.no_roofline and inputs:
        config, dtype, context = inputs
        cost = rl.model_cost(config, dtype, settings.DTYPE_BYTES[dtype])
        machine, floor, measured = machine_figures(args.measure, config, dtype,
                                                   floor_batches(res))
        data["roofline"] = roofline(res, cost, machine, context, floor)
        print_roofline(data["roofline"], measured)
    elif not args.no_roofline:
        print()
        report.note("Roofline: needs task 1 or 2's saved result and the config.json of the "
                    "model it ran (a local folder); run them first.")
    if "lab_run" in res:
        print_lab_run(res["lab_run"])
        data["lab_run"] = res["lab_run"]
    report.insight([
        "vLLM's value is not one fast request: it packs more requests into the same KV memory "
        "(PagedAttention) and runs them as one batch (continuous batching)",
        "A tok/s figure without its concurrency tells half the story",
    ])
    report.saved(results.save(SCRIPT, data))
    return data


if __name__ == "__main__":
    cli.run(main)
