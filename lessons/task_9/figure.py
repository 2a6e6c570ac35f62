"""Task 9's figures, drawn from its saved record (lessons/task_9/record.py) by attribute:

    results/task_9_build_your_own_engine.png         the batching timeline: x the engine step,
                                                     y the batch slot, a colour per request
    results/task_9_build_your_own_engine_phases.png  a decode step split into its phases, beside
                                                     the matmuls alone through F.linear (the
                                                     kernel floor, where the engine's own do not
                                                     beat it: floor_note) and one read of the
                                                     weights

What the timeline plots is worked out by timeline_grid and runs_of, which tests/test_task_9.py
checks on a workload worked out by hand: the matrix, never the pixels.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from common import figures
from lessons.task_9.record import OwnEngine


# --- the batching timeline ----------------------------------------------------------------------
@dataclass(frozen=True)
class Timeline:
    """Batch slots over steps: ids[slot][step] is the request computed in that slot at that
    step (None: the slot was idle); is_padding[slot][step] says its row was padding (a finished
    request, computed and its token thrown away)."""
    ids: list[list[int | None]]
    is_padding: list[list[bool]]

    @property
    def num_steps(self) -> int:
        return len(self.ids[0]) if self.ids else 0


def ids_of(rows: list[str]) -> list[list[int]]:
    """A StepTimeline's space-separated ids, per step, as lists of ints."""
    return [[int(i) for i in row.split()] for row in rows]


def timeline_grid(steps_seq_ids: list[list[int]], steps_padding_ids: list[list[int]],
                  max_batch: int) -> Timeline:
    """Which batch slot each computed row sat in. A request keeps its slot from admission until
    it leaves the batch (it is not computed at a step); a newcomer takes the lowest free slot.
    The engine itself has no slots, only a list of rows: this is the picture a learner draws."""
    num_steps = len(steps_seq_ids)
    ids: list[list[int | None]] = [[None] * num_steps for _ in range(max_batch)]
    is_padding = [[False] * num_steps for _ in range(max_batch)]
    slot_of: dict[int, int] = {}
    for step, (row_ids, padding_ids) in enumerate(zip(steps_seq_ids, steps_padding_ids)):
        for seq_id in [s for s in slot_of if s not in row_ids]:   # left: its slot is free
            del slot_of[seq_id]
        for seq_id in row_ids:
            if seq_id not in slot_of:
                free = sorted(set(range(max_batch)) - set(slot_of.values()))
                if not free:
                    raise ValueError(f"step {step} computed {len(row_ids)} rows, more than "
                                     f"the {max_batch} slots")
                slot_of[seq_id] = free[0]
            ids[slot_of[seq_id]][step] = seq_id
            is_padding[slot_of[seq_id]][step] = seq_id in padding_ids
    return Timeline(ids, is_padding)


def runs_of(row: list, flags: list[bool]) -> list[tuple[int, int, object, bool]]:
    """(start, length, value, flag) of each stretch of equal cells in one slot's row."""
    out: list[tuple[int, int, object, bool]] = []
    for step, (value, flag) in enumerate(zip(row, flags)):
        if out and out[-1][2] == value and out[-1][3] == flag and out[-1][0] + out[-1][1] == step:
            start, length, _, _ = out[-1]
            out[-1] = (start, length + 1, value, flag)
        else:
            out.append((step, 1, value, flag))
    return out


POLICY_ORDER = ("static", "static no-pad", "continuous")


def batching_timeline(res: OwnEngine):
    """x the engine step, y the batch slot, a colour per request; padding hatched, idle slots
    empty; one panel per policy on the same x scale, so the lengths compare at a glance."""
    if not res.timelines:
        return None
    max_batch = res.settings.max_batch
    labels = sorted(res.timelines,
                    key=lambda k: POLICY_ORDER.index(k) if k in POLICY_ORDER else 9)
    grids = {k: timeline_grid(ids_of(res.timelines[k].seq_ids),
                              ids_of(res.timelines[k].padding_ids), max_batch) for k in labels}
    num_steps = max(g.num_steps for g in grids.values())
    panel_in = 0.16 * max_batch + 0.9
    fig, axes = figures.figure(panel_in * len(labels) + 1.6, len(labels), 1, sharex=True,
                               squeeze=False)
    cell_px = 0.8 * figures.WIDTH_IN * figures.DPI / max(num_steps, 1)   # a step's width, roughly
    for ax, label in zip(axes[:, 0], labels):
        grid = grids[label]
        for slot, (row, flags) in enumerate(zip(grid.ids, grid.is_padding)):
            for start, length, seq_id, padded in runs_of(row, flags):
                if seq_id is None:
                    continue
                ax.barh(slot, length, 1, left=start, color=figures.color(seq_id),
                        alpha=0.35 if padded else 1, hatch="////" if padded else None,
                        edgecolor="#333333", linewidth=0.4)
                if not padded and length * cell_px >= 18 and max_batch <= 32:
                    ax.text(start + length / 2, slot, str(seq_id), ha="center", va="center",
                            fontsize=7)
        policy = res.policies.get(label)
        made = (f"; {100 * policy.slot_utilization_fraction:.0f}% of slot-steps made a token"
                if policy else "")
        ax.set_title(f"{label}: {grid.num_steps} steps{made}", loc="left")
        ax.set_ylim(max_batch - 0.5, -0.5)
        ax.set_ylabel("batch slot")
        ax.set_yticks(range(0, max_batch, max(1, max_batch // 8)))
        ax.set_xlim(0, num_steps)
    axes[-1, 0].set_xlabel("engine step (one forward over the batch)")
    # under the last panel's axis label (a figure legend would sit on the title or caption)
    axes[-1, 0].legend(handles=[
        figures.patch(figures.color(0), "a request's token (colour: request, number: its id)"),
        figures.patch(figures.color(0) + "59", "padding: finished, computed, thrown away",
                      hatch="////"),
        figures.patch("white", "idle slot")],
        loc="upper center", bbox_to_anchor=(0.5, -0.65 / panel_in), ncols=3, fontsize=9)
    n = len(res.workload_num_output_tokens)
    return figures.finish(fig, f"Task 9: the batching timeline, {n} requests, batch cap "
                               f"{max_batch}", res)


# --- where a decode step's time goes ------------------------------------------------------------
PHASE_NAMES = {"matmul": "matmuls", "attention": "attention", "forward_other": "rest of forward",
               "sampling": "sampling", "scheduling": "scheduling"}


def floor_note(res: OwnEngine) -> str | None:
    """Where the engine's own matmuls beat F.linear's alone, that bar is no floor: a note that
    says so, batch by batch (the whole step too, where it beat them); None where none did."""
    beaten = []
    for b, phases in sorted(res.phases.items()):
        floor = res.machine.kernel_floor_s[b]
        if phases.matmul_s < floor:
            # as many decimals as it takes to tell the two apart (a tiny model's are < 1 ms)
            digits = next((d for d in (1, 2, 3) if round(1000 * phases.matmul_s, d)
                           != round(1000 * floor, d)), 3)
            beaten.append(f"at batch {b} the engine's matmuls took "
                          f"{1000 * phases.matmul_s:.{digits}f} ms against F.linear's "
                          f"{1000 * floor:.{digits}f}"
                          + (f", its whole step {1000 * phases.step_s:.{digits}f}"
                             if phases.step_s < floor else ""))
    if not beaten:
        return None
    text = "; ".join(beaten)
    return textwrap.fill(f"{text[0].upper()}{text[1:]}: the engine's own kernels beat F.linear, "
                         "so F.linear alone is no floor there.", 105)


def step_phases(res: OwnEngine):
    """The engine's decode step split into its phases at batch 1 and at the cap, beside the
    model's matmuls timed alone through F.linear (the kernel floor, or a note that the engine
    beat it) and one read of the weights at the bandwidth."""
    if not res.phases:
        return None
    machine = res.machine
    fig, ax = figures.figure(4.6)
    width, ticks, names = 0.8, [], []
    for g, b in enumerate(sorted(res.phases)):
        x0, bottom = g * 4, 0.0
        seconds = res.phases[b].by_phase()
        for k, (phase, name) in enumerate(PHASE_NAMES.items()):
            ms = 1000 * seconds[phase]
            ax.bar(x0, ms, width, bottom=bottom, color=figures.color(k),
                   label=name if g == 0 else None)
            bottom += ms
        ax.text(x0, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=9)
        floor, read = 1000 * machine.kernel_floor_s[b], 1000 * machine.weight_read_s
        is_floor = res.phases[b].matmul_s >= machine.kernel_floor_s[b]
        # colours 0-4 are the phases': the two bounds take two of their own
        ax.bar(x0 + 1, floor, width, color="white", edgecolor=figures.color(6), hatch="xx",
               label="the model's matmuls alone through F.linear" if g == 0 else None)
        ax.bar(x0 + 2, read, width, color="white", edgecolor=figures.color(5), hatch="..",
               label="one read of the weights (bandwidth)" if g == 0 else None)
        for x, v in ((x0 + 1, floor), (x0 + 2, read)):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=9)
        ticks += [x0, x0 + 1, x0 + 2]
        names += [f"engine step\nbatch {b}", "kernel\nfloor" if is_floor else "F.linear\nalone",
                  "weights\nread"]
    ax.set_xticks(ticks, names, fontsize=9)
    ax.set_xlabel(floor_note(res) or "", fontsize=9)
    ax.set_ylabel("ms per decode step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"Weights {machine.weight_bytes / 1e6:,.0f} MB at "
                 f"{machine.bandwidth_bytes_s / 1e9:.1f} GB/s")
    return figures.finish(fig, "Task 9: where a decode step's time goes", res)


FIGURES = (("", batching_timeline), ("phases", step_phases))
