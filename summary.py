"""The lab's summary: the source's closing table (its section 10), built from what the scripts
measured and saved in results/*.json, with the model, dtype, cores and date they ran with; the
roofline of this machine that explains tasks 1, 2 and 6; and, after `make lab`, how long each
step took and its peak memory (every process included, the vLLM server too).

    python summary.py                 # measures the roofline here (a few seconds)
    python summary.py --no-roofline   # only the saved results
"""
from __future__ import annotations

import json

from common import cli, report, results, settings
from common import roofline as rl

SCRIPT = "summary"
STEPS = ["verify_environment", "task_1_hf_baseline", "task_2_vllm_inference",
         "task_3_kv_cache_problem", "task_4_paged_attention", "task_5_api_server",
         "task_6_multi_user_load", "task_7_tuning", "task_8_dashboard"]
MEMORY_BUDGET_BYTES = 3.5e9   # the source ran in a 4 GB VM; the lab keeps 0.5 GB for the OS
GB = 1e9


def parse_args(argv: list[str] | None):
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-roofline", action="store_true",
                        help="skip measuring this machine's bandwidth and matmul throughput")
    return parser.parse_args(argv)


def load_all() -> dict[str, dict]:
    return {step: r for step in STEPS + ["lab_run"] if (r := results.load(step)) is not None}


# --- the section-10 table ---------------------------------------------------------------------
def table_rows(res: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(step, what it showed, measured figure) for every step; a step not run says how to run it."""
    def get(step, figure):
        return figure(res[step]) if step in res else f"not run yet: python {step}.py"

    def tuning(r):
        a, c = r["configs"][0], r["configs"][-1]
        return (f"{c['max_num_seqs']} seqs {c['throughput_tok_s']:.1f} vs "
                f"{a['throughput_tok_s']:.1f} tok/s ({c['throughput_tok_s'] / a['throughput_tok_s']:.2f}x)")

    def dashboard(r):
        s = r["snapshot"]
        return f"{s['e2e_count']:,.0f} requests, {s['generation_tokens']:,.0f} tokens read"

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


def roofline(res: dict[str, dict], cost: rl.ModelCost, machine: rl.Machine, context: int) -> dict:
    """Tasks 1, 2 and 6 placed under this machine's ceilings (every figure from the inputs)."""
    single = rl.ceiling(cost, machine, 1, context)
    top = rl.compute_ceiling(cost, machine, context)
    placed = {}
    for step, label in (("task_1_hf_baseline", "HF, 1 request"),
                        ("task_2_vllm_inference", "vLLM, 1 request")):
        if step in res:
            tps = res[step]["tokens_per_s"]
            placed[step] = {"label": label, "tokens_per_s": tps,
                            "pct_of_bandwidth_ceiling": 100 * tps / single["tokens_per_s"]}
    if "task_6_multi_user_load" in res:
        lv = max(res["task_6_multi_user_load"]["levels"], key=lambda lv: lv["users"])
        at_batch = rl.ceiling(cost, machine, lv["users"], context)
        placed["task_6_multi_user_load"] = {
            "label": f"vLLM server, {lv['users']} users", "users": lv["users"],
            "tokens_per_s": lv["throughput_tok_s"],
            "pct_of_compute_ceiling": 100 * lv["throughput_tok_s"] / top,
            "roofline_at_users": at_batch,
            "pct_of_roofline_at_users": 100 * lv["throughput_tok_s"] / at_batch["tokens_per_s"]}
    return {"bandwidth_gb_s": machine.bandwidth_bytes_s / GB,
            "matmul_gflop_s": {k: v / GB for k, v in machine.flops_s.items()},
            "threads": machine.threads, "dtype": cost.dtype, "context": context,
            "num_params": cost.num_params, "weight_bytes": cost.weight_bytes,
            "bytes_per_token": cost.bytes_per_token(context),
            "flops_per_token": cost.flops_per_token(context),
            "bandwidth_ceiling_tok_s": single["tokens_per_s"], "compute_ceiling_tok_s": top,
            "ridge_batch": rl.ridge_batch(cost, machine, context), "placed": placed}


def print_roofline(r: dict) -> None:
    report.section("ROOFLINE: what bounds decoding on this machine")
    report.row("Memory bandwidth (GB/s)", f"{r['bandwidth_gb_s']:.1f} (sum of a "
               f"{rl.BANDWIDTH_MIB} MiB tensor, {r['threads']} threads, best of 5)")
    report.row("Matmul fp32 / bf16 (GFLOP/s)", f"{r['matmul_gflop_s']['float32']:,.0f} / "
               f"{r['matmul_gflop_s']['bfloat16']:,.0f} ({rl.MATMUL_N}x{rl.MATMUL_N} products)")
    report.row("Model", f"{r['num_params']:,} parameters, {r['dtype']}, "
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
    for step, p in r["placed"].items():
        if "pct_of_bandwidth_ceiling" in p:
            report.row(f"  {p['label']}", f"{p['tokens_per_s']:.1f} tok/s = "
                       f"{p['pct_of_bandwidth_ceiling']:.0f}% of the bandwidth ceiling")
        else:
            at = p["roofline_at_users"]
            report.row(f"  {p['label']}", f"{p['tokens_per_s']:.1f} tok/s = "
                       f"{p['pct_of_compute_ceiling']:.1f}% of the compute ceiling")
            report.note(f"(the roofline at {p['users']} requests is {at['tokens_per_s']:,.0f} tok/s, "
                        f"{at['bound']}-bound; measured = {p['pct_of_roofline_at_users']:.0f}% of it)",
                        indent=4)
    report.note("Time per step (ms): requests / (tok/s), vs one read of the weights:")
    floor_ms = 1000 * r["weight_bytes"] / (r["bandwidth_gb_s"] * GB)
    for p in r["placed"].values():
        step_ms = 1000 * p.get("users", 1) / p["tokens_per_s"]
        report.row(f"  {p['label']}", f"{step_ms:.1f} measured, floor {floor_ms:.1f} "
                                      f"({step_ms / floor_ms:.1f}x)")
    text = ("One request reads every weight for each token it makes, so its speed is capped "
            "by memory bandwidth. A batch shares that read: each step reads the weights once "
            "for all its requests, so tokens/s grows with the batch until the matmuls, not the "
            "reads, take the time.")
    one, many = r["placed"].get("task_2_vllm_inference"), r["placed"].get("task_6_multi_user_load")
    if one and many:
        one_ms, many_ms = 1000 / one["tokens_per_s"], 1000 * many["users"] / many["tokens_per_s"]
        text += (f" Here {many['users']} requests share a {many_ms:.0f} ms step where one "
                 f"request took {one_ms:.0f} ms: {many['tokens_per_s'] / one['tokens_per_s']:.1f}x "
                 f"the tokens/s for {many_ms / one_ms:.1f}x the step time.")
    report.paragraph(text + " What is left below the ceilings is the engine's per-step work "
                            "(scheduling, attention, sampling, HTTP), large next to a 135M model "
                            "on 2 cores.")


# --- time and memory of the last `make lab` ---------------------------------------------------
def print_lab_run(run: dict) -> None:
    report.section(f"LAST `make lab` ({run['measured_at'][:16].replace('T', ' ')})")
    report.table(["Step", "Time (s)", "Peak memory (GB)", "Processes"],
                 [(s["script"], f"{s['seconds']:.1f}", f"{s['peak_memory_bytes'] / GB:.2f}"
                   + (" OVER" if s["peak_memory_bytes"] > MEMORY_BUDGET_BYTES else ""),
                   s["peak_processes"]) for s in run["steps"]],
                 widths=[26, 10, 18, 11])
    report.row("Total time (min)", f"{run['total_seconds'] / 60:.1f}")
    worst = max(run["steps"], key=lambda s: s["peak_memory_bytes"])
    report.row("Largest peak (GB)", f"{worst['peak_memory_bytes'] / GB:.2f} ({worst['script']})")
    report.row("Budget (GB)", f"{MEMORY_BUDGET_BYTES / GB:.1f} (the source ran in a 4 GB VM)")
    report.paragraph("Peak memory = PSS of the script, its children and the lab's vLLM server "
                     "(API server, engine core, worker, multiprocessing's resource tracker), "
                     "sampled every 0.25 s.")


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
    report.row("Cores (threads)", settings.num_cores())
    report.row("CPU", settings.cpu_model_name())
    if dates:
        report.row("Measured", f"{dates[0][:16].replace('T', ' ')} to {dates[-1][:16].replace('T', ' ')}")
    report.row("Results", settings.results_dir())

    report.section("WHAT EACH STEP SHOWED (source, section 10)")
    rows = table_rows(res)
    report.table(["Step", "What it showed", "Measured"], rows, widths=[5, 26, 34],
                 align_left=(0, 1, 2))
    data = {"rows": [{"step": s, "what": w, "figure": f} for s, w, f in rows],
            "model": runs[0][0] if runs else None, "dtype": runs[0][1] if runs else None,
            "cores": settings.num_cores()}
    if "task_2_vllm_inference" in res and "task_6_multi_user_load" in res:
        report.note(f"Single request: {res['task_2_vllm_inference']['speedup']:.1f}x. "
                    f"Concurrent requests: {res['task_6_multi_user_load']['scaling_factor']:.1f}x. "
                    "Same engine, two faces.")

    inputs = roofline_inputs(res)
    if not args.no_roofline and inputs:
        config, dtype, context = inputs
        cost = rl.model_cost(config, dtype, settings.DTYPE_BYTES[dtype])
        data["roofline"] = roofline(res, cost, rl.measure_machine(settings.num_cores()), context)
        print_roofline(data["roofline"])
    elif not args.no_roofline:
        report.note("\nRoofline: needs task 1 or 2's saved result and the config.json of the "
                    "model it ran (a local folder); run them first.")
    if "lab_run" in res:
        print_lab_run(res["lab_run"])
        data["lab_run"] = res["lab_run"]
    report.insight([
        "vLLM's value is not one fast request: it packs more requests into the same KV memory "
        "(PagedAttention) and runs them as one batch (continuous batching)",
        "A tok/s figure without its concurrency tells half the story",
    ])
    print(f"Saved: {results.save(SCRIPT, data)}")
    return data


if __name__ == "__main__":
    cli.run(main)
