"""results/report.html: the whole lab on one page, for an instructor, from the saved results.

    python -m common.html_report      # `make report`; `make lab` writes it at its end

One self-contained file that opens offline (the figures are embedded as data: URIs, the page
loads nothing): the machine, model, dtype and dates of the run at the top; then every step of
the lab in order, each with its boxed report as the learner saw it (results/<script>.txt, which
`make lab` saves as each step runs) and its figures, drawn again here from results/<script>.json
(common.figures); then the summary with the roofline. A step with no saved result says "not run
yet", with the command that runs it. Nothing is measured and no model runs.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

from common import cli, figures, report, results, settings

PAGE = "report.html"
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1040px; margin: 0 auto; padding: 1em;
       color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
h2 { border-top: 2px solid #ccc; padding-top: 0.8em; margin-top: 1.6em; }
table.run td { padding: 0.1em 1em 0.1em 0; vertical-align: top; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 13px;
      line-height: 1.25; border: 1px solid #e2e2e2; }
img { max-width: 100%; height: auto; display: block; margin: 0.8em 0;
      border: 1px solid #e2e2e2; }
.missing { color: #8a4b00; font-style: italic; }
nav a { margin-right: 0.8em; white-space: nowrap; }
"""


def step_names() -> list[str]:
    """The lab's steps, in order, as results name them, then the summary (common/steps.py)."""
    from common import steps

    return steps.report_names()


def report_text(name: str) -> str | None:
    """The step's boxed report as printed in the last `make lab` (results/<name>.txt)."""
    try:
        return (settings.results_dir() / f"{name}.txt").read_text(errors="replace")
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


def header(res: dict[str, dict]) -> str:
    """The run at the top: machine, model and dtype, dates, the lab's own time."""
    rows = []
    machine = next((r for r in res.values() if figures.machine_of(r) != "machine not recorded"),
                   None)
    rows.append(("Machine", figures.machine_of(machine) if machine else
                 f"{settings.cpu_model_name()}, {settings.num_cores()} cores (this machine; "
                 f"the results do not say)"))
    runs = results.what_ran({name: results.RunHeader.from_dict(r) for name, r in res.items()})
    if runs:
        rows.append(("Model, dtype", f"{runs[0][0]}, {runs[0][1]}"))
        rows += [("", f"NOTE: {', '.join(steps)} ran {model}, {dtype}")
                 for model, dtype, steps in runs[1:]]
    dates = sorted(r["measured_at"] for r in res.values() if "measured_at" in r)
    if dates:
        rows.append(("Measured", f"{dates[0][:16].replace('T', ' ')} to "
                                 f"{dates[-1][:16].replace('T', ' ')}"))
    run = res.get("lab_run")
    if run:
        how = "python lab.py --quick (small workloads)" if run.get("quick") else "make lab"
        done = "completed" if run.get("completed") else "stopped at a failing step"
        rows.append(("Last lab run", f"{how}: {run['total_seconds'] / 60:.1f} min, {done}"))
    return ('<table class="run">' + "".join(
        f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>" for k, v in rows)
        + "</table>")


def section(name: str, res: dict[str, dict]) -> str:
    text = report_text(name)
    parts = [f'<h2 id="{name}">{html.escape(title_of(name, text))}</h2>']
    script = "summary.py" if name == "summary" else f"{name}.py"
    if name not in res:
        return parts[0] + f'<p class="missing">not run yet: python {script}</p>'
    r = res[name]
    parts.append(f"<p>{html.escape(script)}, measured "
                 f"{html.escape(str(r.get('measured_at', '?'))[:16].replace('T', ' '))} on "
                 f"{html.escape(figures.machine_of(r))}</p>")
    if text is None:
        parts.append('<p class="missing">No report text saved (`make lab` saves each step\'s '
                     'report as it runs; this result was saved by a run of its own).</p>')
    else:
        parts.append(f"<pre>{html.escape(text)}</pre>")
    for path, error in figures.save_figures(name, res):
        parts.append(image(path) if error is None else
                     f'<p class="missing">Figure {html.escape(path.name)} not drawn: '
                     f'{html.escape(error)}</p>')
    return "\n".join(parts)


def build(names: list[str]) -> str:
    res = figures.load_results()
    nav = " ".join(f'<a href="#{n}">{html.escape(n)}</a>' for n in names)
    body = "\n".join(section(n, res) for n in names)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><title>vLLM lab report</title>'
            f"<style>{STYLE}</style></head><body>"
            f"<h1>vLLM lab report</h1>{header(res)}<nav>{nav}</nav>\n{body}\n</body></html>\n")


def write(names: list[str] | None = None) -> Path:
    """Write results/report.html (figures drawn again from the saved results) and return it."""
    path = settings.results_dir() / PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(build(step_names() if names is None else names), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> Path:
    parser = cli.LabArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    path = write()
    report.path_line("Report", path)
    return path


if __name__ == "__main__":
    cli.run(main)
