"""Task 9, part 3: where a decode step's time goes. The engine's own phases (mini_engine's
StepProfiler) at batch 1 and at the fullest batch of the continuous run, beside the model's
matmuls timed alone through F.linear (the kernel floor) and one read of the weights at the
measured bandwidth; then what the engine ran (EngineConfig.kernels). Measuring first, then
printing, then two sentences chosen from these figures: the insight's line (step_limit) and part
3's last line (kernel_choice)."""
from __future__ import annotations

import statistics

from common import fmt, report, settings
from common.machine import machine_figures, model_cost
from lessons.task_9.record import MachineBounds, Phases
from mini_engine import PHASES, LLMEngine, Llama

PHASE_TOKENS = 24    # the batch-1 run whose decode steps are timed
PHASE_LABELS = {"matmul": "matmuls (linear layers)", "attention": "attention (paged)",
                "forward_other": "rest of the forward", "sampling": "sampling",
                "scheduling": "scheduling"}


# --- measuring ----------------------------------------------------------------------------------
def mean_phases(steps) -> Phases:
    """Mean seconds per phase (and per step) over these steps."""
    return Phases(**{f"{p}_s": statistics.mean(s.phases[p] for s in steps) for p in PHASES},
                  step_s=statistics.mean(s.seconds for s in steps), num_steps=len(steps))


def phase_split(one_request: LLMEngine, prompt_ids: list[int], batched_steps) -> dict[int, Phases]:
    """Decode steps only (one new token per row): batch 1 from one request run on one_request
    (a fresh, profiled engine), the cap from the continuous run's full steps (the fullest it
    had, if it never filled the cap)."""
    num_tokens = min(PHASE_TOKENS, settings.MAX_MODEL_LEN - len(prompt_ids))
    one_request.add_request(prompt_ids, num_tokens, min_tokens=num_tokens)
    one_request.run()
    decode = [s for s in batched_steps if s.num_tokens == s.num_rows]
    fullest = max(s.num_rows for s in decode)
    return {1: mean_phases(one_request.steps[1:]),
            fullest: mean_phases([s for s in decode if s.num_rows == fullest])}


def machine_bounds(model: Llama, dtype: str, batches: list[int]) -> MachineBounds:
    """Bandwidth (results/machine.json when saved, else measured now) and the kernel floor of
    the model's own weight shapes at these batch sizes (saved, or measured now: a few seconds),
    through the lab's one loader of the machine's figures (common.machine)."""
    found = machine_figures(model.config, dtype, batches, settings.num_cores(), measure_floor=True)
    bandwidth = found.machine.bandwidth_bytes_s
    weight_bytes = model_cost(model.config, dtype).weight_bytes
    return MachineBounds(bandwidth, weight_bytes, weight_bytes / bandwidth,
                         "measured now" if found.source.startswith("measured now")
                         else "results/machine.json",
                         {b: found.floor.step_s[b] for b in batches})


# --- printing -----------------------------------------------------------------------------------
def print_phases(split: dict[int, Phases], machine: MachineBounds) -> None:
    report.section("3. WHERE THE STEP TIME GOES (decode steps, ms)")
    report.note(f"Each column: the mean {report.term('decode step')}, at that batch.")
    batches = list(split)
    report.table(["Phase", *(f"batch {b}" for b in batches)],
                 [*((PHASE_LABELS[p], *(fmt.ms(split[b].by_phase()[p]) for b in batches))
                    for p in PHASES),
                  ("whole step", *(fmt.ms(split[b].step_s) for b in batches)),
                  ("matmuls alone (F.linear)", *(fmt.ms(machine.kernel_floor_s[b])
                                                 for b in batches)),
                  ("one read of the weights", *(fmt.ms(machine.weight_read_s) for _ in batches))],
                 widths=[33, 16, 16])
    beaten = [b for b in batches if split[b].matmul_s < machine.kernel_floor_s[b]]
    floor = (f"the kernel floor, except at batch {' and '.join(map(str, beaten))}, where the "
             "engine's own matmuls beat it" if beaten else "the kernel floor")
    report.note(f"Weights {machine.weight_bytes / 1e6:,.0f} MB at "
                f"{machine.bandwidth_bytes_s / 1e9:.1f} GB/s ({machine.bandwidth_from}). Matmuls "
                f"alone: the same linear layers through F.linear, unfused: {floor}.")


def print_kernels(kernels: dict[str, str]) -> None:
    """What the engine ran (EngineConfig.kernels), part by part; a library's name, the first
    time the run says it, with its few words (report.term)."""
    report.note("Engine's kernels (--kernels): " + with_terms("; ".join(
        f"{part} {way}" for part, way in kernels.items() if way != "-")))


def with_terms(text: str, names: tuple[str, ...] = ("oneDNN", "SDPA")) -> str:
    """text with the first of each of names in it said through report.term."""
    for name in names:
        if name in text:
            text = text.replace(name, report.term(name), 1)
    return text


# --- the insight lines chosen from these figures ------------------------------------------------
def step_limit(split: dict[int, Phases], machine: MachineBounds) -> str:
    """What bounds a decode step at the cap, from its measured phases."""
    cap = max(split)
    phases = split[cap]
    parts = {"the matmul library": phases.matmul_s, "attention": phases.attention_s,
             "the many small ops and the Python of the step": phases.forward_other_s
             + phases.sampling_s + phases.scheduling_s}
    name = max(parts, key=parts.get)
    step, share = f"{1000 * phases.step_s:.0f}", f"{100 * parts[name] / phases.step_s:.0f}%"
    if name != "the matmul library":
        return f"At batch {cap} a decode step took {step} ms, {share} of it {name}"
    times = phases.matmul_s / machine.weight_read_s
    if times > 1.5:
        return (f"At batch {cap} a decode step took {step} ms, {share} of it the matmul library, "
                f"{times:.1f}x one read of the weights: the kernels on these skinny shapes, more "
                "than memory, set the pace")
    return (f"At batch {cap} a decode step took {step} ms, {share} of it the matmul library, "
            f"{times:.1f}x one read of the weights: memory bandwidth sets the pace")


def kernel_choice(split: dict[int, Phases], machine: MachineBounds,
                  kernels: dict[str, str]) -> str:
    """The engine's matmuls inside the step at the fullest batch against the kernel floor
    through F.linear: what the step's way of multiplying saved or cost (no floor where it
    beats it)."""
    cap = max(split)
    in_step, floor = 1000 * split[cap].matmul_s, 1000 * machine.kernel_floor_s[cap]
    products = kernels["products"]
    if floor < in_step:
        return (f"At batch {cap} its matmuls ({products}) took {in_step:.1f} ms a step inside "
                f"the engine; the kernel floor through F.linear took {floor:.1f} ms, "
                f"{in_step - floor:.1f} ms less")
    return (f"At batch {cap} its matmuls ({products}) took {in_step:.1f} ms a step inside the "
            f"engine; F.linear alone took {floor:.1f} ms, {floor - in_step:.1f} ms more: the "
            "engine's products beat it, so F.linear is no floor here")
