"""Task 13's printing: the header, the four parts and the KEY INSIGHT lines, each chosen from the
figures of the record (lessons/task_13/record.py). What a learner does not need to follow the
lesson (how each figure was taken, the products' timings, the floors' sources) is printed inside
report.detail(): with --detail, or on the report page."""
from __future__ import annotations

from common import fmt, measure, report
from lessons.task_13.record import CompiledStep
from mini_engine import PHASES

GB = 1e9
LABELS = {"matmul": "matmuls", "attention": "attention", "forward_other": "rest of forward",
          "sampling": "sampling", "scheduling": "scheduling"}
LABEL_WIDTH = 17
VM_BYTES = 4 * GB      # the source's VM


def print_header(model, dtype, threads: int, s) -> None:
    report.title("Task 13: the step itself - what compiling the model buys")
    report.run_info(model, dtype, threads)
    report.note(f"mini_engine on task 9's workload ({s.requests} requests, mean output "
                f"{s.mean_output}, {report.term('greedy')}, cap {s.max_batch}), three ways: "
                f"torch; {report.term('eager')}, its C kernels; compiled, the same C kernels in "
                f"one torch.compile graph made by {report.term('inductor')}.")
    report.note(f"vLLM offline, a fresh process each way, its peak {report.term('PSS')} "
                f"sampled: 1 request, then {s.vllm_requests} at once, {s.vllm_tokens} tokens "
                "each; then task 9's workload.")
    with report.detail():
        report.row("KV", f"blocks of {s.page_size} tokens, {s.kv_cache_bytes:,} B; vLLM "
                   f"max_num_seqs {s.max_batch}, EOS held off; task 9's workload in turns with "
                   "mini_engine")
        report.row("EngineConfig", "kernels 'torch', 'c' (mini_engine/kernels/) and "
                   "'compiled' (mini_engine/kernels/compiled.py)")


def phase_rows(columns, parts=PHASES) -> list:
    return [(LABELS[p], *(fmt.ms(ph.by_phase()[p]) for _, _, ph in columns)) for p in parts]


def print_kernels(r: CompiledStep) -> None:
    """Part 1: what the C kernels buy a decode step, against the torch way, at 1 and the cap."""
    if r.torch is None:
        return
    report.section("1-2. A DECODE STEP: TORCH, THE C KERNELS, COMPILED")
    batches = sorted(r.eager.phases)
    columns = [(b, name, mode.phases[b]) for b in batches
               for name, mode in (("torch", r.torch), ("C", r.eager))]
    width = (65 - LABEL_WIDTH) // len(columns)
    report.table(["ms", *(f"{name} {b}" for b, name, _ in columns)],
                 [*phase_rows(columns, ("matmul", "attention")),
                  ("whole step", *(fmt.ms(ph.step_s) for _, _, ph in columns))],
                 [LABEL_WIDTH] + [width] * len(columns))
    with report.detail():
        report.row("Tokens/s", f"torch {r.torch.tokens_per_s:.1f}, C {r.eager.tokens_per_s:.1f} "
                   f"({fmt.times(r.eager.tokens_per_s / r.torch.tokens_per_s)})")
        report.note("C: " + "; ".join(f"{part} {way}"
                                      for part, way in r.eager.kernels.items() if way != "-")
                    + ". Part 4 has attention at longer contexts.")
        if r.eager.products_ms:
            report.note(f"Products, timed when the engine chose them, ms a pass over all at "
                        f"batch {' + '.join(map(str, batches))}: " + "; ".join(
                            f"{way} {' + '.join(f'{ms:.1f}' for ms in times)}"
                            for way, times in r.eager.products_ms.items())
                        + f" (kept: {r.eager.kernels['products']})")


def phases_table(r: CompiledStep) -> None:
    modes = [("eager", r.eager)] + ([("compiled", r.compiled)] if r.compiled else [])
    columns = [(batch, name, mode.phases[batch]) for batch in sorted(r.eager.phases)
               for name, mode in modes]
    width = (65 - LABEL_WIDTH) // len(columns)
    report.table(["ms", *(f"{name} {batch}" for batch, name, _ in columns)],
                 [*phase_rows(columns),
                  ("whole step", *(fmt.ms(ph.step_s) for _, _, ph in columns)),
                  ("matmuls alone", *(fmt.ms(r.machine.kernel_floor_s[b]) for b, _, _ in columns)),
                  ("weights read", *(fmt.ms(r.machine.weight_read_s) for _ in columns))],
                 [LABEL_WIDTH] + [width] * len(columns))
    report.note(f"A {report.term('decode step')}, each batch's mean; floors: the matmuls "
                "alone, one read of the weights.")
    with report.detail():
        report.note(f"The weights ({r.machine.weight_bytes / 1e6:,.0f} MB) read once at "
                    f"{r.machine.bandwidth_bytes_s / 1e9:.1f} GB/s ({r.machine.bandwidth_from}); "
                    "the matmuls timed alone through F.linear. Compiled, the matmuls and "
                    "attention are custom ops in the graph and time themselves; the rest is "
                    "inductor's fused loops.")
        if r.compiled:
            report.row(f"Compiled at {r.cap}", largest_part_text(r))
            report.row("  with the rest gone", f"the eager step would be "
                       f"{fmt.times(r.fusion_floor(r.cap))} as long, at best")


def largest_part_text(r: CompiledStep) -> str:
    """The largest part of the compiled step at the cap, and its share."""
    c = r.compiled.phases[r.cap]
    parts = {"the matmuls": c.matmul_s, "attention": c.attention_s,
             "the rest of the forward": c.forward_other_s,
             "sampling and scheduling": c.sampling_s + c.scheduling_s}
    biggest = max(parts, key=parts.get)
    share = fmt.pct(parts[biggest] / c.step_s)
    if biggest == "the matmuls":
        return (f"the largest part left is the matmuls, {share} of the step, "
                f"{c.matmul_s / r.machine.weight_read_s:.1f}x one read of the weights")
    return f"the largest part left is {biggest}, {share} of the step"


def print_engine(r: CompiledStep) -> None:
    print_kernels(r)
    if r.torch is None:
        report.section("1-2. A DECODE STEP: EAGER AND COMPILED")
    phases_table(r)
    rows = ([("torch", r.torch)] if r.torch else []) + [("eager", r.eager)] + (
        [("compiled", r.compiled)] if r.compiled else [])
    report.table(["", "warm-up s", "graphs", "RSS added MB", "tokens/s"],
                 [(name, f"{m.warm_up_s:.1f}", m.num_graphs, f"{m.warm_up_added_bytes / 1e6:.0f}",
                   f"{m.tokens_per_s:.1f}") for name, m in rows], [13, 12, 9, 16, 15])
    with report.detail():
        report.note("Warm-up: a first engine (its KV pool included; eager, the C built and the "
                    "weights packed for it); compiled, the compile too, on the same model and "
                    "kernels. After it no step compiled: a graph it would have needed is an "
                    "error (mini_engine/kernels/compiled.py). Tokens/s: the ways took turns on "
                    "the workload, each its median pass.")
    if r.compiled is None:
        report.row("Compiled", f"not measured: {r.compile_skipped}")
        return
    report.row("Greedy tokens", f"{r.num_identical} of {r.num_requests} requests identical")
    with report.detail():
        report.row("Tokens/s, compiled", f"{fmt.times(r.speedup)} eager's")
        report.row(f"Step at batch {r.cap}", f"{fmt.times(r.step_ratio(r.cap))} as long as "
                   f"eager (batch 1: {fmt.times(r.step_ratio(1))})")
        report.row("Greedy tokens in", r.header.dtype)


def print_vllm(r: CompiledStep) -> None:
    report.section("3. VLLM: THE SOURCE'S enforce_eager=True AGAINST COMPILED")
    if not r.vllm:
        report.note(f"Not measured: {r.vllm_skipped or '--no-vllm'}.")
        return
    s = r.settings
    report.table(["", "start-up s", "peak PSS GB", "1 req tok/s", f"{s.vllm_requests} tok/s"],
                 [(name, f"{m.startup_s:.1f}", f"{m.peak_pss_bytes / GB:.2f}",
                   f"{m.one_tokens_per_s:.1f}", f"{m.batch_tokens_per_s:.1f}")
                  for name, m in r.vllm.items()], [10, 13, 14, 14, 14])
    if len(r.vllm) < 2:
        report.note(f"Not measured: {r.vllm_skipped}.")
        return
    eager, comp = r.vllm["eager"], r.vllm["compiled"]
    same = sum(a == b for a, b in zip(eager.texts, comp.texts))
    report.row("Greedy text", f"{same} of {len(eager.texts)} answers the same")
    with report.detail():
        one = comp.one_tokens_per_s / eager.one_tokens_per_s
        report.row("Compiled over eager", f"{fmt.times(one)} at 1, {fmt.times(r.vllm_speedup)} "
                   f"at {s.vllm_requests}")


def print_same_workload(r: CompiledStep) -> None:
    """mini_engine against vLLM run the same way, on task 9's workload, in tokens/s: one row."""
    ratios = {mode: r.over_vllm(mode) for mode in ("eager", "compiled") if r.over_vllm(mode)}
    if not ratios:
        return
    report.row("Task 9's, mini_engine/vLLM", ", ".join(f"{fmt.times(ratio)} {mode}"
                                                       for mode, ratio in ratios.items()))
    with report.detail():
        for mode in ratios:
            theirs = r.vllm[mode]
            report.row(f"  tokens/s, {mode}", f"mini_engine {theirs.mini_tokens_per_s:.1f}, "
                       f"vLLM {theirs.workload_tokens_per_s:.1f}")
        report.note("Task 9's workload: mini_engine and vLLM run the same way took turns, a "
                    "pass each, while that vLLM process lived; each side's median pass of "
                    "those rounds. Task 9 measures the same ratio another way: vLLM inside "
                    "task 9's own process, sampled at the lab's temperature, its rounds with "
                    "the batching policies; here vLLM runs in a child process, greedy, and "
                    "the rounds hold the torch and compiled ways, in a process that compiled.")


def print_attention(r: CompiledStep) -> None:
    """Part 4: a decode step's attention at each context, both engines, at 1 and at the cap."""
    a = r.attention
    if a is None:
        return
    report.section("4. ATTENTION IN A DECODE STEP AS THE CONTEXT GROWS")
    cap = a.cap
    columns = [(1, "torch", "torch"), (1, "mini", "C"), (1, "vllm", "vLLM"),
               (cap, "torch", "torch"), (cap, "mini", "C"), (cap, "vllm", "vLLM")]
    columns = [c for c in columns if a.at(c[1], c[0], a.contexts[0]) is not None]
    report.table(["context", *(f"{name} {batch}" for batch, _, name in columns)],
                 [(f"{L:,}", *(f"{a.at(which, batch, L):.1f}" for batch, which, _ in columns))
                  for L in a.contexts],
                 [8] + [9] * len(columns))
    report.note(f"ms of a decode step's attention. C and vLLM read the blocks in place; "
                f"torch gathers them for {report.term('SDPA')}.")
    with report.detail():
        report.note("Each layer's call, B requests each over L tokens, their blocks scattered "
                    "over a pool of random values (kernels/paged_attention.c). Both compiled "
                    "forwards call these same kernels"
                    + ("." if a.vllm_ms else
                       f"; vLLM not measured: {r.vllm_skipped or '--no-vllm'}."))


# --- the KEY INSIGHT: one claim a line, each a whole template -------------------------------------
def moved_text(e, c) -> str:
    """The parts that run the same C kernels eager and compiled (the matmuls, attention) whose
    time moved beyond the lab's tolerance (measure.AGREE_WITHIN): 'attention 3.8 -> 2.5 ms'."""
    moved = [(name, a, b) for name, a, b in (("matmuls", e.matmul_s, c.matmul_s),
                                             ("attention", e.attention_s, c.attention_s))
             if not measure.within(a, b)]
    return ", ".join(f"{name} {fmt.ms(a)} -> {fmt.ms(b)} ms" for name, a, b in moved)


def engine_line(r: CompiledStep) -> str:
    """What compiling changed in mini_engine's step at the cap, chosen from its measured split:
    the rest of the forward (what the compile fuses) cut or not, and whether the matmuls and
    attention, which call the same C kernels either way, kept their time (moved_text)."""
    cap, e, c = r.cap, r.eager.phases[r.cap], r.compiled.phases[r.cap]
    before, after = fmt.ms(e.step_s), fmt.ms(c.step_s)
    rest = f"{fmt.ms(e.forward_other_s)} -> {fmt.ms(c.forward_other_s)} ms"
    cut = round(1000 * c.forward_other_s, 1) < round(1000 * e.forward_other_s, 1)  # as printed
    moved = moved_text(e, c)
    if cut and not moved:
        return (f"Compiled, mini_engine's step at {cap} went {before} -> {after} ms, all in "
                f"the fused rest of the forward ({rest}): the C kernels, the same either way, "
                "kept their time.")
    if cut:
        return (f"Compiled, mini_engine's step at {cap} went {before} -> {after} ms: the "
                f"fused rest of the forward {rest}, and the same C kernels moved too ({moved}).")
    if not moved:
        return (f"Compiled, mini_engine's step at {cap} went {before} -> {after} ms, though "
                f"the rest of the forward did not shorten ({rest}) and the C kernels kept their "
                "time.")
    return (f"Compiled, mini_engine's step at {cap} went {before} -> {after} ms: the rest "
            f"of the forward did not shorten ({rest}); C kernels moved ({moved}).")


def kernels_line(r: CompiledStep) -> str:
    """What the C kernels bought mini_engine over the torch way, in tokens/s and a step."""
    cap, t, c = r.cap, r.torch.phases[r.cap], r.eager.phases[r.cap]
    gain = fmt.times(r.eager.tokens_per_s / r.torch.tokens_per_s)
    step = f"{fmt.ms(t.step_s)} -> {fmt.ms(c.step_s)} ms"
    if r.eager.tokens_per_s > (1 + measure.AGREE_WITHIN) * r.torch.tokens_per_s:
        return (f"mini_engine's C kernels made {gain} the torch way's tokens/s ({step} a step "
                f"at {cap}): they earn their place.")
    return (f"mini_engine's C kernels made {gain} the torch way's tokens/s, within "
            f"{measure.AGREE_WITHIN:.0%}: the torch way is enough here.")


def vllm_line(r: CompiledStep) -> str:
    """What compiling cost vLLM and bought it, and the source's choice weighed in its own terms:
    the share of a 4 GB VM it saved against the tokens/s it gave up."""
    eager, comp = r.vllm["eager"], r.vllm["compiled"]
    mem = (comp.peak_pss_bytes - eager.peak_pss_bytes) / GB
    start = comp.startup_s - eager.startup_s
    gain, share = r.vllm_speedup - 1, mem * GB / VM_BYTES
    speed = fmt.times(r.vllm_speedup)
    if gain <= 0 or share <= 0:      # compiling bought no speed, or cost no memory
        return (f"vLLM compiled made {speed} eager's tokens/s for {mem:+.2f} GB and {start:+.0f} "
                f"s of start-up: the source's eager had no trade to weigh here "
                f"({100 * gain:+.0f}% tokens/s, {100 * share:+.0f}% of a 4 GB VM).")
    if gain > share:
        return (f"vLLM compiled made {speed} eager's tokens/s for {mem:+.2f} GB and {start:+.0f} "
                f"s of start-up: eager saved {fmt.pct(share)} of a 4 GB VM and gave up "
                f"{fmt.pct(gain)} more tokens/s, the wrong trade here.")
    return (f"vLLM compiled made {speed} eager's tokens/s for {mem:+.2f} GB and {start:+.0f} s "
            f"of start-up: eager saved {fmt.pct(share)} of a 4 GB VM and gave up {fmt.pct(gain)} "
            "more tokens/s, the right trade here.")


def workload_line(r: CompiledStep) -> str | None:
    """mini_engine over vLLM on task 9's workload, each mode run alike; None where no mode ran."""
    eager, compiled = r.over_vllm("eager"), r.over_vllm("compiled")
    if eager and compiled:
        e, c = fmt.times(eager), fmt.times(compiled)
        if measure.within(eager, compiled):
            return (f"On task 9's workload mini_engine made {e} vLLM's tokens/s eager and {c} "
                    "compiled: compiling helped the two alike.")
        if compiled < eager:
            return (f"On task 9's workload mini_engine made {e} vLLM's tokens/s eager and {c} "
                    "compiled: compiling helped vLLM more.")
        return (f"On task 9's workload mini_engine made {e} vLLM's tokens/s eager and {c} "
                "compiled: compiling helped mini_engine more.")
    if eager:
        return f"On task 9's workload mini_engine made {fmt.times(eager)} vLLM's tokens/s, eager."
    if compiled:
        return (f"On task 9's workload mini_engine made {fmt.times(compiled)} vLLM's tokens/s, "
                "compiled.")
    return None


def attention_line(r: CompiledStep) -> str:
    """A decode step's attention at the longest context and the cap, against vLLM's kernel."""
    a = r.attention
    cap, first, last = a.cap, a.contexts[0], a.contexts[-1]
    mine, theirs = a.at("mini", cap, last), a.at("vllm", cap, last)
    if theirs is None:
        return (f"At {last:,} tokens and {cap} requests mini_engine's attention took {mine:.1f} "
                f"ms, {mine / a.at('mini', cap, first):.1f}x its time at {first} tokens (its "
                f"torch way: {a.at('torch', cap, last):.1f} ms).")
    gap, gap_first = mine / theirs, a.at("mini", cap, first) / a.at("vllm", cap, first)
    if mine <= (1 + measure.AGREE_WITHIN) * theirs:
        return (f"At {last:,} tokens and {cap} requests mini_engine's attention took {mine:.1f} "
                f"ms, and vLLM's kernel {theirs:.1f} ms: mini_engine's kept up.")
    if gap_first <= 1 + measure.AGREE_WITHIN:
        return (f"At {last:,} tokens and {cap} requests mini_engine's attention took {mine:.1f} "
                f"ms, {gap:.1f}x vLLM's, though it kept up at {first} tokens ({gap_first:.1f}x).")
    if round(gap, 1) > round(gap_first, 1):
        return (f"At {last:,} tokens and {cap} requests mini_engine's attention took {mine:.1f} "
                f"ms, {gap:.1f}x vLLM's: a gap that grew ({gap_first:.1f}x at {first}).")
    return (f"At {last:,} tokens and {cap} requests mini_engine's attention took {mine:.1f} ms, "
            f"{gap:.1f}x vLLM's: a gap that did not grow ({gap_first:.1f}x at {first}).")


def insight(r: CompiledStep) -> list[str]:
    lines = ([engine_line(r)] if r.compiled
             else [f"mini_engine was not compiled here: {r.compile_skipped}."])
    if r.torch:
        lines.append(kernels_line(r))
    if r.vllm and len(r.vllm) == 2:
        lines.append(vllm_line(r))
    lines.append(workload_line(r))
    if r.attention:
        lines.append(attention_line(r))
    return [line for line in lines if line]


def print_report(r: CompiledStep) -> None:
    print_engine(r)
    print_vllm(r)
    print_same_workload(r)
    print_attention(r)
    report.detail_hint()
    report.insight(insight(r))
