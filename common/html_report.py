"""results/report.html: the whole lab on one page, for an instructor, from the saved results.

    python -m common.html_report      # `make report`; `make lab` writes it at its end

It leads with the answer: the run (machine, model, dtype, dates), then the source's closing table
(its section 10) with the source's own figure beside this run's for every step, then every
figure, drawn again here from results/<script>.json (the FIGURES of each step's lesson package,
the summary's last: common/steps.py), then each step's boxed report as the learner saw it
(results/<script>.txt, which `make lab` saves as each step runs), folded away, one click to
open. One self-contained file that opens offline: the figures are embedded as data: URIs and the
page loads nothing. A step with no saved result says "not run yet", with the command that runs
it. Nothing is measured and no model runs.
"""
from __future__ import annotations

import base64
import html
import os
from pathlib import Path

from common import cli, figures, report, results, settings, steps

PAGE = "report.html"
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1040px; margin: 0 auto; padding: 1em;
       color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
h2 { border-top: 2px solid #ccc; padding-top: 0.8em; margin-top: 1.6em; }
table.run td { padding: 0.1em 1em 0.1em 0; vertical-align: top; }
table.steps { border-collapse: collapse; width: 100%; }
table.steps th, table.steps td { border-bottom: 1px solid #ddd; padding: 0.35em 0.6em;
                                 text-align: left; vertical-align: top; }
table.steps th { background: #f0f0f0; }
table.steps td.source { color: #555; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 13px;
      line-height: 1.25; border: 1px solid #e2e2e2; }
img { max-width: 100%; height: auto; display: block; margin: 0.8em 0;
      border: 1px solid #e2e2e2; }
details { margin: 0.4em 0; }
summary { cursor: pointer; font-weight: 600; padding: 0.3em 0; }
.missing { color: #8a4b00; font-style: italic; }
"""


def sections() -> list[steps.Step]:
    """The lab's steps, in order, then the summary (common/steps.py: each read from its lesson's
    package, the summary's from lessons/summary/)."""
    return [*steps.STEPS, steps.SUMMARY]


def report_text(name: str, part: str = "") -> str | None:
    """The step's boxed report as printed in the last `make lab` (results/<name>.txt); part
    ".detail": what it left out of the terminal (results/<name>.detail.txt)."""
    try:
        return (settings.results_dir() / f"{name}{part}.txt").read_text(errors="replace")
    except OSError:
        return None


def title_of(name: str, text: str | None) -> str:
    """The report's own title (the line under its first ===== bar), else the script's name."""
    lines = (text or "").splitlines()
    for above, line in zip(lines, lines[1:]):
        if above.startswith("=====") and line.strip():
            return line.strip()
    return name


def image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{html.escape(path.name)}">'


def when(result: results.Result) -> str:
    return (result.measured_at or "?")[:16].replace("T", " ")


def header(res: dict[str, results.Result]) -> str:
    """The run at the top: machine, model and dtype, dates, the lab's own time."""
    rows = []
    machine = next((r for r in res.values() if r.measured_on), None)
    rows.append(("Machine", figures.machine_of(machine) if machine else
                 f"{settings.cpu_model_name()}, {settings.num_cores()} cores (this machine; "
                 f"the results do not say)"))
    runs = results.what_ran({name: r.header for name, r in res.items()})
    if runs:
        rows.append(("Model, dtype", f"{runs[0][0]}, {runs[0][1]}"))
        rows += [("", f"NOTE: {', '.join(names)} ran {model}, {dtype}")
                 for model, dtype, names in runs[1:]]
    dates = sorted(when(r) for r in res.values() if r.measured_at)
    if dates:
        rows.append(("Measured", f"{dates[0]} to {dates[-1]}"))
    run = res.get("lab_run")
    if run:
        how = "python lab.py --quick (small workloads)" if run.quick else "make lab"
        done = "completed" if run.completed else "stopped at a failing step"
        rows.append(("Last lab run", f"{how}: {run.total_seconds / 60:.1f} min, {done}"))
    return ('<table class="run">' + "".join(
        f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
        + "</table>")


def steps_table(res: dict[str, results.Result], stale: dict[str, str]) -> str:
    """The source's section 10, step by step: the source's figure beside this run's."""
    rows = steps.table_rows(res, stale)
    body = "".join(
        f"<tr><td>{html.escape(r.step)}</td><td>{html.escape(r.what)}</td>"
        f'<td class="source">{html.escape(r.source)}</td><td>{html.escape(r.figure)}</td></tr>'
        for r in rows)
    return ('<h2 id="table">What each step showed (the source\'s section 10)</h2>'
            '<table class="steps"><tr><th>Step</th><th>What it showed</th>'
            '<th>Source (SmolLM-135M, 2-core 4 GB VM)</th><th>This run</th></tr>'
            f"{body}</table>")


def figures_part(parts: list[steps.Step], res: dict[str, results.Result]) -> str:
    """Every figure of every step and of the summary, drawn again from the saved results."""
    out = ['<h2 id="figures">Figures</h2>']
    for part in parts:
        if part.name not in res:
            continue
        for path, error in figures.draw(part.name, res[part.name], part.figures):
            out.append(image(path) if error is None else
                       f'<p class="missing">Figure {html.escape(path.name)} not drawn: '
                       f'{html.escape(error)}</p>')
    return "\n".join(out)


def folded_report(part: steps.Step, res: dict[str, results.Result], stale: dict[str, str]) -> str:
    """A step's boxed report, folded (<details>): its title is the one line shown."""
    text = report_text(part.name)
    title = html.escape(title_of(part.name, text))
    if part.name not in res:
        why = stale.get(part.name) or f"not run yet: {part.label}"
        return (f'<details id="{part.name}"><summary>{title}</summary>'
                f'<p class="missing">{html.escape(why)}</p></details>')
    r = res[part.name]
    body = [f"<p>{html.escape(part.script)}, measured {html.escape(when(r))} on "
            f"{html.escape(figures.machine_of(r))}</p>"]
    if text is None:
        body.append('<p class="missing">No report text saved (`make lab` saves each step\'s '
                    'report as it runs; this result was saved by a run of its own).</p>')
    else:
        body.append(f"<pre>{html.escape(text)}</pre>")
    more = report_text(part.name, ".detail")
    if more:
        body.append(f"<p>The detail its terminal left out (--detail prints it):</p>"
                    f"<pre>{html.escape(more)}</pre>")
    return (f'<details id="{part.name}"><summary>{title}</summary>' + "".join(body)
            + "</details>")


def glossary_link() -> str:
    """A link to docs/glossary.md, relative to where the page is written, so it opens offline."""
    glossary = settings.REPO_DIR / "docs" / "glossary.md"
    href = Path(os.path.relpath(glossary, settings.results_dir())).as_posix()
    return (f'<p>The terms the reports use (TTFT, TPOT, PSS, spread...), one line each: '
            f'<a href="{html.escape(href)}">docs/glossary.md</a></p>')


def build(parts: list[steps.Step]) -> str:
    res, stale = steps.load_all(parts)
    reports = "\n".join(folded_report(p, res, stale) for p in parts)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>vLLM lab report</title>'
            f"<style>{STYLE}</style></head><body>"
            f"<h1>vLLM lab report</h1>{header(res)}\n{glossary_link()}\n"
            f"{steps_table(res, stale)}\n"
            f"{figures_part(parts, res)}\n"
            f'<h2 id="reports">Every step\'s report (click to open)</h2>\n{reports}\n'
            f"</body></html>\n")


def write(parts: list[steps.Step] | None = None) -> Path:
    """Write results/report.html (figures drawn again from the saved results) and return it."""
    path = settings.results_dir() / PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build(sections() if parts is None else parts), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> Path:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    path = write()
    report.path_line("Report", path)
    return path


if __name__ == "__main__":
    cli.run(main)
