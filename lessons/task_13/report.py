"""Task 13's printing: the header, the four parts and the KEY INSIGHT lines, each chosen from the
figures of the record (lessons/task_13/record.py)."""
from __future__ import annotations

from common import report
from lessons.task_13.record import CompiledStep
from mini_engine import PHASES

GB = 1e9
LABELS = {"matmul": "matmuls", "attention": "attention", "forward_other": "rest of forward",
          "sampling": "sampling", "scheduling": "scheduling"}
LABEL_WIDTH = 17


def print_header(model, dtype, threads: int, s) -> None:
    report.title("Task 13: the step itself - what compiling the model buys")
    report.run_info(model, dtype, threads)
    report.row("mini_engine", f"task 9's workload: {s.requests} requests, mean output "
               f"{s.mean_output}, greedy; cap {s.max_batch}, pages of {s.page_size}, "
               f"{s.kv_cache_bytes:,} B of KV")
    report.row("  ways", "torch: plain torch (EngineConfig.kernels 'torch'); eager: its C "
               "kernels where they build ('c', mini_engine/kernels/); compiled: the same C, the "
               "decoder layers one graph of torch.compile (inductor), the products and "
               "attention called in it ('compiled')")
    report.row("vLLM", f"offline, a fresh process each way; 1 request, then {s.vllm_requests} "
               f"at once, {s.vllm_tokens} tokens each, greedy, EOS held off; then task 9's "
               f"workload, as mini_engine ran it (max_num_seqs {s.max_batch})")


def phases_table(r: CompiledStep) -> None:
    modes = [("eager", r.eager)] + ([("compiled", r.compiled)] if r.compiled else [])
    columns = [(batch, name, mode.phases[batch]) for batch in sorted(r.eager.phases)
               for name, mode in modes]
    width = (65 - LABEL_WIDTH) // len(columns)
    report.table(["ms", *(f"{name} {batch}" for batch, name, _ in columns)],
                 [*((LABELS[p], *(f"{1000 * ph.by_phase()[p]:.1f}" for _, _, ph in columns))
                    for p in PHASES),
                  ("whole step", *(f"{1000 * ph.step_s:.1f}" for _, _, ph in columns)),
                  ("matmuls alone", *(f"{1000 * r.machine.kernel_floor_s[b]:.1f}"
                                      for b, _, _ in columns)),
                  ("weights read", *(f"{1000 * r.machine.weight_read_s:.1f}" for _ in columns))],
                 [LABEL_WIDTH] + [width] * len(columns))
    report.note(f"Decode steps only, each batch's mean. Floors: the weights "
                f"({r.machine.weight_bytes / 1e6:,.0f} MB) read once at "
                f"{r.machine.bandwidth_bytes_s / 1e9:.1f} GB/s ({r.machine.bandwidth_from}); the "
                "matmuls timed alone through F.linear. Compiled, the matmuls and attention are "
                "custom ops in the graph and time themselves; the rest is inductor's fused loops")


def print_kernels(r: CompiledStep) -> None:
    """Part 1: what the C kernels buy a decode step, against the torch way, at 1 and the cap."""
    if r.torch is None:
        return
    report.section("1. WHAT THE KERNELS BUY: A DECODE STEP, TORCH AND C")
    batches = sorted(r.eager.phases)
    columns = [(b, name, mode.phases[b]) for b in batches
               for name, mode in (("torch", r.torch), ("C", r.eager))]
    width = (65 - LABEL_WIDTH) // len(columns)
    report.table(["ms", *(f"{name} {b}" for b, name, _ in columns)],
                 [*((LABELS[p], *(f"{1000 * ph.by_phase()[p]:.1f}" for _, _, ph in columns))
                    for p in ("matmul", "attention", "forward_other")),
                  ("whole step", *(f"{1000 * ph.step_s:.1f}" for _, _, ph in columns))],
                 [LABEL_WIDTH] + [width] * len(columns))
    report.note("C: " + "; ".join(f"{part} {way}" for part, way in r.eager.kernels.items()
                                  if way != "-")
                + f". Tokens/s on task 9's workload: torch {r.torch.tokens_per_s:.1f}, C "
                f"{r.eager.tokens_per_s:.1f} ({r.eager.tokens_per_s / r.torch.tokens_per_s:.2f}x);"
                " part 4 has attention at longer contexts")
    if r.eager.products_ms:
        report.note(f"Products, timed when the engine chose them, ms a pass over all at batch "
                    f"{' + '.join(map(str, batches))}: " + "; ".join(
                        f"{way} {' + '.join(f'{ms:.1f}' for ms in times)}"
                        for way, times in r.eager.products_ms.items())
                    + f" (kept: {r.eager.kernels['products']})")


def print_engine(r: CompiledStep) -> None:
    print_kernels(r)
    report.section("1-2. MINI_ENGINE: WHERE A DECODE STEP GOES, EAGER AND COMPILED")
    phases_table(r)
    report.section("THE COST AND THE GAIN")
    rows = ([("torch", r.torch)] if r.torch else []) + [("eager", r.eager)] + (
        [("compiled", r.compiled)] if r.compiled else [])
    report.table(["", "warm-up s", "graphs", "RSS added MB", "tokens/s"],
                 [(name, f"{m.warm_up_s:.1f}", m.num_graphs, f"{m.warm_up_added_bytes / 1e6:.0f}",
                   f"{m.tokens_per_s:.1f}") for name, m in rows], [13, 12, 9, 16, 15])
    report.note("Warm-up: a first engine (its KV pool included; eager, the C built and the "
                "weights packed for it); compiled, the compile too, on the same model and "
                "kernels. After it no step compiled: a graph it would have needed is an error "
                "(mini_engine/kernels/compiled.py). Tokens/s: the ways took turns on the "
                "workload, each its median pass")
    if r.compiled is None:
        report.row("Compiled", f"not measured: {r.compile_skipped}")
        return
    report.row("Tokens/s, compiled", f"{r.speedup:.2f}x eager")
    report.row(f"Step at batch {r.cap}", f"{r.step_ratio(r.cap):.2f}x as long as eager (batch "
               f"1: {r.step_ratio(1):.2f}x; compiled, a step of one row runs as two)")
    report.row("Greedy tokens", f"{r.num_identical} of {r.num_requests} requests identical "
               f"in {r.header.dtype} (fp32: tests/engine/test_compiled.py)")


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
    report.row("Compiled over eager", f"{comp.one_tokens_per_s / eager.one_tokens_per_s:.2f}x "
               f"at 1, {r.vllm_speedup:.2f}x at {s.vllm_requests}")
    report.row("Greedy text", f"{same} of {len(eager.texts)} answers the same")


def print_same_workload(r: CompiledStep) -> None:
    """mini_engine against vLLM run the same way, on task 9's workload, in tokens/s."""
    for mode in ("eager", "compiled"):
        ratio = r.over_vllm(mode)
        if ratio is not None:
            theirs = r.vllm[mode]
            report.row(f"Task 9's workload, {mode}", f"mini_engine {theirs.mini_tokens_per_s:.1f}, "
                       f"vLLM {theirs.workload_tokens_per_s:.1f} tok/s: {ratio:.2f}x vLLM")
    if r.vllm:
        report.note("Task 9's workload: mini_engine and vLLM run the same way took turns, a pass "
                    "each, while that vLLM process lived; each side's median pass of those rounds")


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
    report.note("ms of one decode step's attention calls, one a layer: B requests (1, then "
                f"{cap}) each over L tokens, their pages scattered over a pool of random values. "
                "mini_engine's C reads each request's pages in place, in one pass "
                "(kernels/paged_attention.c); its torch way gathers the contexts, pads them to "
                "the longest and attends by SDPA. vLLM: its CPU kernel, reading the pages in "
                "place. Both compiled forwards call these same kernels"
                + ("" if a.vllm_ms else f"; vLLM not measured: {r.vllm_skipped or '--no-vllm'}"))


def attention_line(r: CompiledStep) -> str:
    """What attention costs at the longest context and the cap, against vLLM's kernel."""
    a = r.attention
    cap = a.cap
    first, last = a.contexts[0], a.contexts[-1]
    mine, one = a.at("mini", cap, last), a.at("torch", cap, last)
    line = (f"At {last:,} tokens of context and {cap} requests, a decode step's attention took "
            f"{mine:.1f} ms in mini_engine's C ({one:.1f} ms its torch way, gathered), "
            f"{mine / a.at('mini', cap, first):.1f}x its {first} tokens' time")
    theirs = a.at("vllm", cap, last)
    if theirs is None:
        return line
    line += (f"; vLLM's kernel took {theirs:.1f} ms ({theirs / a.at('vllm', cap, first):.1f}x)")
    if mine > theirs:
        gap_first = a.at("mini", cap, first) / a.at("vllm", cap, first)
        line += (f". mini_engine's kernel, reading the pages in place too, took "
                 f"{mine / theirs:.1f}x vLLM's time, "
                 + (f"a gap that grew with the context ({gap_first:.1f}x at {first})"
                    if round(mine / theirs, 1) > round(gap_first, 1) else
                    f"a gap that did not grow with the context ({gap_first:.1f}x at {first})"))
    else:
        line += ". mini_engine's kernel kept up with vLLM's: both read the pages in place"
    return line


VM_BYTES = 4 * GB      # the source's VM


def engine_lines(r: CompiledStep) -> list[str]:
    """What compiling changed in mini_engine's step at the cap, and what its step is left with."""
    cap, e, c = r.cap, r.eager.phases[r.cap], r.compiled.phases[r.cap]
    before, after = 1000 * e.forward_other_s, 1000 * c.forward_other_s
    verb = "cut" if round(after, 1) < round(before, 1) else "did not shorten"   # as printed
    lines = [f"Compiling mini_engine's layers {verb} the rest of its step (all but the products "
             f"and attention: the norms, RoPE, SiLU, the adds) at batch {cap}: {before:.1f} -> "
             f"{after:.1f} ms, while its matmuls, the same calls, took {1000 * e.matmul_s:.1f} -> "
             f"{1000 * c.matmul_s:.1f} ms; the step took {r.step_ratio(cap):.2f}x as long, "
             f"tokens/s {r.speedup:.2f}x, for {r.compiled.warm_up_s:.0f} s of warm-up. A "
             f"compile that fuses only the rest could take the step to "
             f"{r.fusion_floor(cap):.2f}x at best, with all of the rest gone: the products, "
             "attention and sampling are the same calls either way"]
    parts = {"the matmuls": c.matmul_s, "attention": c.attention_s,
             "the rest of the forward": c.forward_other_s,
             "sampling and scheduling": c.sampling_s + c.scheduling_s}
    biggest = max(parts, key=parts.get)
    line = (f"The largest part left is {biggest}: {100 * parts[biggest] / c.step_s:.0f}% of the "
            "compiled step")
    if biggest == "the matmuls":
        line += (f", {c.matmul_s / r.machine.weight_read_s:.1f}x one read of the weights. "
                 "Compiling calls the same products, so it does not take the step below them")
    return lines + [line]


def vllm_lines(r: CompiledStep) -> list[str]:
    """What compiling cost vLLM and bought it, and the source's choice weighed in its own terms:
    the share of a 4 GB VM it saved against the tokens/s it gave up (compiled over eager, less
    one: compiling's gain, in per cent of the eager speed)."""
    eager, comp = r.vllm["eager"], r.vllm["compiled"]
    mem = (comp.peak_pss_bytes - eager.peak_pss_bytes) / GB
    start = comp.startup_s - eager.startup_s
    gain = r.vllm_speedup - 1
    same = sum(a == b for a, b in zip(eager.texts, comp.texts))
    text = ("the same greedy text" if same == len(eager.texts) else
            f"{len(eager.texts) - same} of {len(eager.texts)} greedy answers changed")
    line = (f"vLLM compiled: {r.vllm_speedup:.2f}x tokens/s at {r.settings.vllm_requests} "
            f"requests, for {mem:+.2f} GB of memory and {start:+.0f} s of start-up; {text}. ")
    share = mem * GB / VM_BYTES
    if gain <= 0 or share <= 0:      # compiling bought no speed, or cost no memory
        line += (f"Compiling changed vLLM's tokens/s by {100 * gain:+.0f}% and its memory by "
                 f"{100 * share:+.0f}% of a 4 GB VM: no trade to weigh for the source's "
                 "enforce_eager=True on this machine")
    elif gain > share:
        line += (f"The source's enforce_eager=True saved {100 * share:.0f}% of a 4 GB VM "
                 f"and gave up {100 * gain:.0f}% more tokens/s: on this machine it was the "
                 f"wrong trade, unless {start:.0f} s a start matters more")
    else:
        line += (f"The source's enforce_eager=True saved {100 * share:.0f}% of a 4 GB VM "
                 f"and {start:.0f} s a start, and gave up {100 * gain:.0f}% more tokens/s: "
                 "on this machine it was the right trade")
    return [line]


def kernels_line(r: CompiledStep) -> str:
    """What the C kernels bought mini_engine's decode step over the torch way, part by part."""
    cap, t, c = r.cap, r.torch.phases, r.eager.phases
    gain = r.eager.tokens_per_s / r.torch.tokens_per_s
    return (f"mini_engine's C kernels took a decode step from {1000 * t[1].step_s:.1f} to "
            f"{1000 * c[1].step_s:.1f} ms at batch 1 and {1000 * t[cap].step_s:.1f} to "
            f"{1000 * c[cap].step_s:.1f} ms at {cap} (attention {1000 * t[cap].attention_s:.1f}"
            f" -> {1000 * c[cap].attention_s:.1f}, matmuls {1000 * t[cap].matmul_s:.1f} -> "
            f"{1000 * c[cap].matmul_s:.1f}); tokens/s {gain:.2f}x the torch way's, "
            + ("so they earn their place here" if gain > 1.1 else
               "within a tenth of it: on this machine the torch way is enough"))


def insight(r: CompiledStep) -> list[str]:
    lines = (engine_lines(r) if r.compiled
             else [f"mini_engine was not compiled here: {r.compile_skipped}"])
    if r.torch:
        lines.append(kernels_line(r))
    ratios = {mode: r.over_vllm(mode) for mode in ("eager", "compiled")}
    ratio_text = (f"On task 9's workload mini_engine made {ratios['eager']:.2f}x vLLM's "
                  f"tokens/s eager and {ratios['compiled']:.2f}x compiled: compiling helped "
                  + ("vLLM more than mini_engine" if ratios["compiled"] < ratios["eager"]
                     else "mini_engine as much as vLLM or more")) if all(ratios.values()) else None
    if r.vllm and len(r.vllm) == 2:
        lines += [f"{line}. {ratio_text}" if ratio_text else line for line in vllm_lines(r)]
    elif ratio_text:
        lines.append(ratio_text)
    if r.attention:
        lines.append(attention_line(r))
    return lines


def print_report(r: CompiledStep) -> None:
    print_engine(r)
    print_vllm(r)
    print_same_workload(r)
    print_attention(r)
    report.insight(insight(r))
