"""Task 12's figure (task_12_speculative_decoding.py draws it after saving). Left, one answer of
each workload made alone at vLLM's k, as text, each token on the colour of how it came: an
accepted guess, or the model's own token (its first, each one after a rejected guess, each bonus
after a run of accepted ones). Right, above, the tokens a decoding request gained in a step, 1
to k + 1, for both workloads; below, the speed-up of speculation over none, mini_engine at each k
and vLLM, one request at a time and many at once, copy and chat. A pure function of the saved
record (lessons/task_12/record.py's SpeculativeDecoding), read by attribute."""
from __future__ import annotations

from common import figures
from lessons.task_12.record import WORKLOADS

GUESS, OWN = "#9AD0F0", "#F5C26B"       # the palette's sky blue and orange, lightened for text
# one colour one meaning on the page: the answers take sky and orange, the workloads purple and
# grey, each k of mini_engine blue, green and yellow, vLLM vermillion
WORKLOAD_COLOURS = {"copy": figures.color(6), "chat": figures.color(7)}
K_COLOURS = [figures.color(4), figures.color(2), figures.color(3)]
COLUMNS = 76            # characters a line of an answer: 76 x 4.8 pt = 5.1 in, the panel's width
FONT_PT = 8
CHAR_PT = 0.602 * FONT_PT     # the advance of a DejaVu Sans Mono character: 0.602 of its size
LINE_PT = 1.6 * FONT_PT       # a line, with room for the tokens' boxes
NEWLINE = "\u21b5"      # how a token's line break shows


def text_grid(tokens: list[str], columns: int = COLUMNS) -> list[tuple[int, int, str]]:
    """(line, column, text) of each token, laid out as the answer reads: a token goes on the
    next line when it would pass the last column or after a line break (shown as NEWLINE)."""
    placed, line, col = [], 0, 0
    for tok in tokens:
        shown = tok.replace("\n", NEWLINE)
        if col and col + len(shown) > columns:
            line, col = line + 1, 0
        placed.append((line, col, shown))
        col += len(shown)
        if "\n" in tok:
            line, col = line + 1, 0
    return placed


def answer_text(ax, answer, num_requests_word: str) -> None:
    """The answer, a token a box, on the colour of how it came, laid out from the panel's top
    left in points (a character CHAR_PT wide, a line LINE_PT high); axes off (a text panel)."""
    from matplotlib.transforms import offset_copy

    for (line, col, shown), is_guess in zip(text_grid(answer.tokens), answer.is_guess):
        at = offset_copy(ax.transAxes, ax.figure, x=col * CHAR_PT, y=-(line + 0.5) * LINE_PT,
                         units="points")
        ax.text(0, 1, shown, transform=at, family="DejaVu Sans Mono", fontsize=FONT_PT,
                va="center", ha="left", parse_math=False,
                bbox={"facecolor": GUESS if is_guess else OWN, "edgecolor": "white",
                      "linewidth": 0.5, "pad": 1.0})
    ax.axis("off")
    guessed = sum(answer.is_guess)
    ax.set_title(f"{answer.workload}: one answer {num_requests_word}, k = {answer.k}: "
                 f"{guessed} of {len(answer.tokens)} tokens accepted guesses", fontsize=10,
                 loc="left")


def tokens_per_step(ax, res) -> None:
    """Per workload, the share of its decoding rows that gained 1, 2, ..., k + 1 tokens."""
    k = res.settings.vllm_k
    width = 0.8 / len(WORKLOADS)
    for i, name in enumerate(WORKLOADS):
        run = res.engine_run(name, False, k)
        total = sum(run.steps_by_tokens)
        x = [n + 1 + (i - (len(WORKLOADS) - 1) / 2) * width for n in range(k + 1)]
        ax.bar(x, [100 * c / total for c in run.steps_by_tokens], width * 0.95,
               color=WORKLOAD_COLOURS[name], label=f"{name}: {run.tokens_per_step:.1f} a step")
    ax.set_xticks(range(1, k + 2))
    ax.set_xlabel(f"tokens a request gained in a step (k = {k}: 1 to {k + 1})")
    ax.set_ylabel("decoding steps (%)")
    ax.set_title("mini_engine, each request alone")
    ax.legend(loc="upper center", fontsize=9)


def speedups(ax, res) -> None:
    """Grouped bars: per workload and level, mini_engine at each k, then vLLM; 1x drawn."""
    s = res.settings
    groups = [(name, c) for name in WORKLOADS for c in (False, True)]
    series = [(f"mini_engine k={k}", lambda name, c, k=k: res.engine_speedup_spread(name, c, k))
              for k in s.ks]
    if res.vllm and not s.base_url:
        series.append((f"vLLM k={s.vllm_k}", res.vllm_speedup_spread))
    width = 0.84 / len(series)
    top = 1.0
    for j, (label, spread_of) in enumerate(series):
        x = [g + (j - (len(series) - 1) / 2) * width for g in range(len(groups))]
        spreads = [spread_of(name, c) for name, c in groups]
        values = [sp.median if sp else 0.0 for sp in spreads]
        # the range of the passes as an error bar, where there were several
        several = [sp is not None and sp.num_passes > 1 for sp in spreads]
        errors = [[v - sp.low if many else 0.0 for v, sp, many in zip(values, spreads, several)],
                  [sp.high - v if many else 0.0 for v, sp, many in zip(values, spreads, several)]]
        top = max(top, *values, *(sp.high for sp in spreads if sp))
        bars = ax.bar(x, values, width * 0.92, label=label,
                      color=figures.color(5) if label.startswith("vLLM") else
                      K_COLOURS[j % len(K_COLOURS)],
                      edgecolor="#333333", linewidth=0.4, yerr=errors, capsize=2,
                      error_kw={"elinewidth": 0.8, "ecolor": "#333333"})
        ax.bar_label(bars, [f"{v:.2f}" for v in values], fontsize=7, padding=2, rotation=90)
    ax.axhline(1.0, color="#333333", linewidth=1, linestyle="--")
    levels = {False: "alone", True: f"{s.num_requests} at once"}
    ax.set_xticks(range(len(groups)), [f"{name}\n{levels[c]}" for name, c in groups])
    ax.set_ylim(0, top * 1.35)
    ax.set_ylabel("tokens/s over speculation off (x)")
    ax.set_title("speed-up (1x: none; lines: the passes)")
    ax.legend(loc="upper right", fontsize=8, ncol=2)


def draw_speculation(res):
    """None when the record holds no answer to show."""
    if len(res.answers) < len(WORKLOADS):
        return None
    fig, axes = figures.figure(6.5, 2, 2, width_ratios=[1.45, 1])
    for ax, answer in zip(axes[:, 0], res.answers):
        answer_text(ax, answer, "alone")
    tokens_per_step(axes[0][1], res)
    speedups(axes[1][1], res)
    axes[0][0].legend(handles=[figures.patch(GUESS, "an accepted guess"),
                               figures.patch(OWN, "the model's own token (where a guess was "
                                                  "wrong, after the last, or none)")],
                      loc="lower left", fontsize=9)
    return figures.finish(fig, "Task 12: guess, then check: which tokens came as accepted "
                               "guesses, and what it bought", res)
