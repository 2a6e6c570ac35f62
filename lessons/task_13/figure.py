"""Task 13's figure (task_13_compiled_step.py draws it after saving). Left, mini_engine: a decode
step's time at batch 1 and at the cap, eager and compiled, each bar split into its measured parts
(the matmuls, attention, the rest of the forward, sampling and scheduling), with the two floors as
lines: one read of the weights at the measured bandwidth, and the model's matmuls timed alone.
Right, vLLM, eager (the source's) and compiled: a step's time as its tokens/s give it (requests /
tokens per second: vLLM's phases are not timed from outside), at 1 request and at its batch, the
same floors drawn. A pure function of the saved record (lessons/task_13/record.py), read by
attribute."""
from __future__ import annotations

from common import figures

PARTS = (("matmul_s", "matmuls"), ("attention_s", "attention"),
         ("forward_other_s", "rest of the forward"), ("sampling_s", "sampling"),
         ("scheduling_s", "scheduling"))
WEIGHTS, KERNELS = "#333333", "#B22222"


def floors(ax, res, xs_by_batch: dict[int, list[float]]) -> None:
    """One read of the weights across the panel; the matmuls alone above each batch's bars."""
    ms = 1000 * res.machine.weight_read_s
    ax.axhline(ms, color=WEIGHTS, linestyle="--", linewidth=1,
               label=f"one read of the weights ({ms:.1f} ms)")
    for i, (batch, xs) in enumerate(xs_by_batch.items()):
        floor = res.machine.kernel_floor_s.get(batch)
        if floor is not None:
            ax.hlines(1000 * floor, min(xs) - 0.4, max(xs) + 0.4, color=KERNELS, linewidth=1.5,
                      label="the matmuls alone (F.linear)" if i == 0 else None)


def engine_panel(ax, res) -> None:
    modes = [("eager", res.eager)] + ([("compiled", res.compiled)] if res.compiled else [])
    xs_by_batch, labels, x = {}, [], 0
    for batch in sorted(res.eager.phases):
        for name, mode in modes:
            phases, bottom = mode.phases[batch], 0.0
            for j, (field, part) in enumerate(PARTS):
                ms = 1000 * getattr(phases, field)
                ax.bar(x, ms, 0.7, bottom=bottom, color=figures.color(j),
                       label=part if x == 0 else None, edgecolor="white", linewidth=0.5)
                bottom += ms
            ax.text(x, bottom, f"{1000 * phases.step_s:.1f}", ha="center", va="bottom",
                    fontsize=9)
            xs_by_batch.setdefault(batch, []).append(x)
            labels.append(f"{name}\nbatch {batch}")
            x += 1
        x += 0.5
    floors(ax, res, xs_by_batch)
    ax.set_xticks([x for xs in xs_by_batch.values() for x in xs], labels)
    ax.set_ylabel("a decode step (ms)")
    ax.set_title("mini_engine: a step in its parts")
    ax.legend(loc="upper left", fontsize=8)


def vllm_panel(ax, res) -> None:
    s, xs_by_batch, labels, x = res.settings, {}, [], 0
    for batch in (1, s.vllm_requests):
        for j, (name, mode) in enumerate(res.vllm.items()):
            tok_s = mode.one_tokens_per_s if batch == 1 else mode.batch_tokens_per_s
            ms = 1000 * batch / tok_s
            ax.bar(x, ms, 0.7, color=figures.color(6 + j), edgecolor="white")
            ax.text(x, ms, f"{ms:.1f}", ha="center", va="bottom", fontsize=9)
            xs_by_batch.setdefault(batch, []).append(x)
            labels.append(f"{name}\n{batch} at once")
            x += 1
        x += 0.5
    floors(ax, res, {b: xs for b, xs in xs_by_batch.items() if b in res.machine.kernel_floor_s})
    ax.set_xticks([x for xs in xs_by_batch.values() for x in xs], labels)
    ax.set_ylabel("a step, from tokens/s (ms)")
    ax.set_title("vLLM: eager (the source's) and compiled")


def draw_step(res):
    fig, axes = figures.figure(5.0, 1, 2 if res.vllm else 1, squeeze=False)
    engine_panel(axes[0][0], res)
    if res.vllm:
        vllm_panel(axes[0][1], res)
        top = max(ax.get_ylim()[1] for ax in axes[0])
        for ax in axes[0]:
            ax.set_ylim(0, top * 1.15)
    return figures.finish(fig, "Task 13: a decode step, eager and compiled, against the floors",
                          res)
