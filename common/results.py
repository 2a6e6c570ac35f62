"""results/<script>.json: what each script measured, for the summary, the figures and graders.

A script's result is one dataclass, built as it measures and saved whole; it is read back into
the same dataclass (nested records, lists and numbers typed), so the summary, the figures and
the report page read attributes, never keys:

    results.save(SCRIPT, PagedKV(header=RunHeader.of(model, dtype, threads), ...))
    results.load("task_4_paged_attention", PagedKV, "task 4")      # -> PagedKV, or None

Every file carries the run header (which model, from where, which dtype and why, threads), when
and on which machine it was measured, and LAB_RESULTS, the version of this layout. Each step's
record lives in its lesson's package (lessons/<lesson>/__init__.py names it RECORD); this module
holds only what every result shares and lab.py's own record of its run (LabRun).

A file from an older lab (another LAB_RESULTS, or a field missing or of the wrong kind) or a
broken one raises StaleResult, whose message is one line:
"results/task_6_multi_user_load.json was written by an older lab: run task 6 again".
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from common import settings

LAB_RESULTS = 3   # the layout version: 2 = run header + typed records; 3 = whole records,
                  # every unit in its field's name


class StaleResult(Exception):
    """A saved result the lab cannot read: written by an older lab, or broken. One line."""


# --- the records ---------------------------------------------------------------------------------
@dataclass
class Record:
    """A typed part of a result: its fields are everything saved, JSON on disk."""

    def to_dict(self) -> dict:
        """The fields as JSON values; a figure not measured (None where the default is None)
        is left out, as it was never saved, and so is a field the record holds only while the
        run lasts (init=False: raw outputs, per-request results), which from_dict never reads."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.init and not (value is None and f.default is None):
                out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, data: dict):
        """The record, its fields typed (nested records too); keys it does not name are left
        out. A missing field without a default, or a value of the wrong kind, raises ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            if f.name in data:
                kwargs[f.name] = _typed(hints[f.name], data[f.name], f"{cls.__name__}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}: no {f.name!r}")
        return cls(**kwargs)


def _plain(value):
    if isinstance(value, Record):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _typed(hint, value, where: str):
    """value (from JSON) as hint says: records built, numbers checked; else ValueError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _typed(arg, value, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{where}: {value!r}")
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_dict(value)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        return [_typed(args[0], v, where) for v in value] if args else value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_typed(args[0], v, where) for v in value)
        if args and len(args) != len(value):
            raise ValueError(f"{where}: expected {len(args)} items")
        return tuple(_typed(a, v, where) for a, v in zip(args, value)) if args else tuple(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        if not args:
            return value
        key = int if args[0] is int else (lambda k: k)   # JSON keys are strings: 1 -> "1"
        try:
            return {key(k): _typed(args[1], v, where) for k, v in value.items()}
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected a whole number, got {value!r}")
        return value
    if hint in (str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


@dataclass(frozen=True)
class RunHeader:
    """What ran: every result names its model, where it came from, its dtype and why, threads."""
    model: str | None = None
    model_source: str | None = None
    model_path: str | None = None
    dtype: str | None = None
    dtype_reason: str | None = None
    threads: int | None = None

    @classmethod
    def of(cls, model=None, dtype=None, threads: int | None = None,
           model_name: str | None = None) -> "RunHeader":
        """From the resolved model (common.model) and dtype (settings.DtypeChoice); either may be
        None (a --base-url server: the model it lists, model_name, is all there is)."""
        return cls(model_name or (model.name if model else None),
                   model.source if model else ("external" if model_name else None),
                   model.path if model else None,
                   dtype.dtype if dtype else None, dtype.reason if dtype else None, threads)

    @classmethod
    def from_dict(cls, data: dict) -> "RunHeader":
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


@dataclass
class Machine(Record):
    """The machine that measured a result: results.save stamps it on every one."""
    cpu: str
    cores: int

    @property
    def label(self) -> str:
        return f"{self.cpu}, {self.cores} cores"


@dataclass
class Result(Record):
    """A step's saved result: its header, when and where it was measured, its figures."""
    header: RunHeader = field(default_factory=RunHeader, kw_only=True)
    measured_at: str = field(default="", kw_only=True)
    measured_on: Machine | None = field(default=None, kw_only=True)

    def to_dict(self) -> dict:
        body = super().to_dict()
        header = body.pop("header")
        return {**{k: v for k, v in header.items() if v is not None}, **body}

    @classmethod
    def from_dict(cls, data: dict):
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        # the header's keys, except those the record names itself (the machine's threads)
        header_keys = ({f.name for f in dataclasses.fields(RunHeader)}
                       - {f.name for f in dataclasses.fields(cls)})
        record = super().from_dict({k: v for k, v in data.items()
                                    if k not in header_keys and k != "header"})
        record.header = RunHeader.from_dict(data)
        return record


# --- the lab's own records: lab.py's run, the machine's figures -----------------------------------
@dataclass
class LabStepRun(Record):
    script: str
    seconds: float
    peak_memory_bytes: int
    peak_processes: int
    exit_code: int = 0
    args: list[str] = field(default_factory=list)


@dataclass
class LabRun(Result):
    """results/lab_run.json: every step `make lab` ran, its time and peak memory."""
    total_seconds: float
    completed: bool
    steps: list[LabStepRun]
    quick: bool = False
    port: int | None = None


# --- save and load -------------------------------------------------------------------------------
def path_of(name: str) -> Path:
    return settings.results_dir() / f"{name}.json"


def save(script: str, record: Result) -> Path:
    """Write the result, stamped with when and on which machine it was measured (a figure names
    both), to results/<script>.json and return the path."""
    record.measured_at = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    record.measured_on = Machine(settings.cpu_model_name(), settings.num_cores())
    body = {"script": script, "lab_results": LAB_RESULTS, **record.to_dict()}
    path = path_of(script)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def load_raw(name: str, rerun: str) -> dict | None:
    """The saved JSON as a dict (None when the file is missing); StaleResult when unreadable.
    rerun: how to write it anew ('run task 6 again'), for the one line."""
    path = path_of(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StaleResult(f"{_shown(path)} is broken ({type(e).__name__}): {rerun}") from None
    if not isinstance(data, dict):
        raise StaleResult(f"{_shown(path)} is broken (not a JSON object): {rerun}")
    return data


def parse(name: str, data: dict, record: type[Result], rerun: str):
    """A saved dict as its record, or StaleResult (one line) if this lab cannot read it."""
    if data.get("lab_results") != LAB_RESULTS:
        raise StaleResult(f"{_shown(path_of(name))} was written by an older lab: {rerun}")
    try:
        return record.from_dict(data)
    except (ValueError, TypeError) as e:
        raise StaleResult(f"{_shown(path_of(name))} was written by an older lab ({e}): "
                          f"{rerun}") from None


def load(name: str, record: type[Result], label: str | None = None):
    """results/<name>.json as its record; None if it was never saved; StaleResult (one line)
    if it was written by an older lab or is broken. label: what a learner runs to write it anew
    ('task 6'; the caller knows its step), else `python <name>.py`."""
    rerun = f"run {label or f'python {name}.py'} again"
    data = load_raw(name, rerun)
    return None if data is None else parse(name, data, record, rerun)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def what_ran(headers: dict[str, RunHeader]) -> list[tuple[str, str, list[str]]]:
    """(model, dtype, results that ran it), the most common first; a lab should show one."""
    runs: dict[tuple[str, str], list[str]] = {}
    for name, header in headers.items():
        if header.model and header.dtype:
            model = header.model.rstrip("/").rsplit("/", 1)[-1]
            runs.setdefault((model, header.dtype), []).append(name)
    return sorted(((model, dtype, names) for (model, dtype), names in runs.items()),
                  key=lambda run: -len(run[2]))
