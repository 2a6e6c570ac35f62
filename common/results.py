"""results/<script>.json: what each script measured, for the summary and for graders."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from common import settings


def save(script: str, data: dict) -> Path:
    """Write data (plus when and on which machine it was measured: a figure names both) to
    results/<script>.json and return the path."""
    out_dir = settings.results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{script}.json"
    record = {"script": script,
              "measured_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
              "measured_on": {"cpu": settings.cpu_model_name(), "cores": settings.num_cores()},
              **data}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def load(script: str) -> dict | None:
    try:
        return json.loads((settings.results_dir() / f"{script}.json").read_text())
    except (OSError, ValueError):
        return None
