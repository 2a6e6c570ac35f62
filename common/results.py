"""results/<script>.json: what each script measured, for the summary, the figures and graders.

One function writes a result (`save`), one reads it back (`load`), into the same dataclass:

    results.save(SCRIPT, RunHeader.of(model, dtype, threads), data)   # data: a Record or a dict
    results.load("task_6_multi_user_load")                            # -> MultiUserLoad

Every file carries the run header (which model, from where, which dtype and why, threads), when
and on which machine it was measured, and LAB_RESULTS, the version of this layout. A Record
types the fields the lab reads back (the summary's row, the roofline); everything else a script
saved rides along in `extra`, so the JSON a grader opens is the same flat file it always was.

A file from an older lab (no LAB_RESULTS, or a field the lab now reads is missing or of the
wrong kind) or a broken one raises StaleResult, whose message is one line:
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

LAB_RESULTS = 2   # the layout version: 2 = run header + typed records (issue 17)


class StaleResult(Exception):
    """A saved result the lab cannot read: written by an older lab, or broken. One line."""


# --- the records ---------------------------------------------------------------------------------
@dataclass
class Record:
    """A typed result. Fields are what the lab reads back; `extra` keeps the rest as saved."""
    extra: dict = field(default_factory=dict, kw_only=True, repr=False)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "extra" and not (value is None and f.default is None):
                out[f.name] = _plain(value)   # a figure not measured is left out, as saved
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, data: dict):
        """The record, its fields typed (nested records too); keys it does not name go to extra.
        A missing field without a default, or a value of the wrong kind, raises ValueError."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        known, kwargs = set(), {}
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            known.add(f.name)
            if f.name in data:
                kwargs[f.name] = _typed(hints[f.name], data[f.name], f"{cls.__name__}.{f.name}")
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}: no {f.name!r}")
        return cls(**kwargs, extra={k: v for k, v in data.items() if k not in known})


def _plain(value):
    if isinstance(value, Record):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, list):
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
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return {k: _typed(args[1], v, where) for k, v in value.items()} if args else value
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
class Result(Record):
    """A step's saved result: its header, when and where it was measured, its figures."""
    header: RunHeader = field(default_factory=RunHeader, kw_only=True)
    measured_at: str = field(default="", kw_only=True)
    measured_on: dict | None = field(default=None, kw_only=True)

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


# task 0
@dataclass
class EnvironmentCheck(Result):
    passed: int
    total: int
    machine: dict | None = None


# tasks 1 and 2: one request
@dataclass
class OneRequest(Result):
    tokens_per_s: float
    total_time_s: float | None = None
    generated_tokens: int | None = None
    prompt_tokens: int | None = None


@dataclass
class HFBaseline(OneRequest):
    pass


@dataclass
class VLLMInference(OneRequest):
    speedup: float | None = None


# tasks 3 and 4
@dataclass
class ContiguousKV(Result):
    utilization_pct: float


@dataclass
class PagedFigures(Record):
    utilization_pct: float


@dataclass
class PagedKV(Result):
    paged: PagedFigures
    users_ratio: float | None = None


# task 5
@dataclass
class HttpCall(Record):
    latency_s: float


@dataclass
class ApiServer(Result):
    raw_http: HttpCall


# task 6
@dataclass
class LoadLevel(Record):
    users: int
    throughput_tok_s: float | None = None
    mean_tpot_s: float | None = None


@dataclass
class MultiUserLoad(Result):
    levels: list[LoadLevel]
    scaling_factor: float


# task 7
@dataclass
class TuningRun(Record):
    label: str
    throughput_tok_s: float


@dataclass
class Tuning(Result):
    configs: list[TuningRun]


# task 8
@dataclass
class Snapshot(Record):
    running: int | float
    waiting: int | float
    kv_usage: float | None = None


@dataclass
class Interval(Record):
    tokens_per_s: float


@dataclass
class LoadSent(Record):
    sent: int


@dataclass
class Dashboard(Result):
    snapshot: Snapshot
    last_interval: Interval | None = None   # None: the server restarted between the two reads
    load: LoadSent | None = None


# task 9
@dataclass
class Correctness(Record):
    num_identical: int
    num_prompts: int


@dataclass
class OwnEngine(Result):
    correctness: Correctness
    continuous_over_static: float | None = None
    engine_over_vllm: float | None = None


@dataclass
class PrefixCaching(Result):
    hit_rate: float                  # mini_engine, cache on: prompt tokens taken from the cache
    ttft_off_s: float                # mini_engine's mean TTFT, cache off and on
    ttft_on_s: float
    vllm_hit_rate: float | None = None   # vLLM's, from /metrics (None: part 4 not run)


# the summary, lab.py's run, the machine's figures
@dataclass
class Summary(Result):
    rows: list[dict] = field(default_factory=list)


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
    total_seconds: float
    completed: bool
    steps: list[LabStepRun]
    quick: bool = False


@dataclass
class MachineFigures(Result):
    bandwidth_bytes_s: float
    flops_s: dict[str, float]
    threads: int
    matmul_n: dict[str, int] | None = None
    kernel_floor: dict | None = None
    host: str = "?"


# result name -> its record (steps.py names the tasks'; these are the lab's own)
LAB_RECORDS: dict[str, type[Result]] = {"lab_run": LabRun, "machine": MachineFigures,
                                        "summary": Summary}


def record_of(name: str) -> type[Result]:
    """The record a result of this name is read into (a task's from common.steps)."""
    from common import steps

    step = steps.by_name().get(name)
    return step.result if step and step.result else LAB_RECORDS.get(name, Result)


# --- save and load -------------------------------------------------------------------------------
def path_of(name: str) -> Path:
    return settings.results_dir() / f"{name}.json"


def save(script: str, header: RunHeader | Record | dict | None = None,
         data: Record | dict | None = None) -> Path:
    """Write the result (the header, when and on which machine it was measured: a figure names
    both) to results/<script>.json and return the path. save(name, data) without a header works
    too, for the lab's own records and the tests."""
    if not isinstance(header, RunHeader):
        header, data = None, header
    body = data.to_dict() if isinstance(data, Record) else dict(data or {})
    for stamp in ("script", "lab_results", "measured_at", "measured_on"):   # stamped here, now
        body.pop(stamp, None)
    record = {"script": script, "lab_results": LAB_RESULTS,
              "measured_at": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
              "measured_on": {"cpu": settings.cpu_model_name(), "cores": settings.num_cores()},
              **({k: v for k, v in dataclasses.asdict(header).items() if v is not None}
                 if header else {}),
              **body}
    path = path_of(script)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def rerun_hint(name: str) -> str:
    """'run task 6 again' / 'run python summary.py again': how to write this result anew."""
    from common import steps

    step = steps.by_name().get(name)
    if step is not None:
        return f"run {step.label} again"
    return "run make lab again" if name in LAB_RECORDS else f"run python {name}.py again"


def load_raw(name: str) -> dict | None:
    """The saved JSON as a dict (None when the file is missing); StaleResult when unreadable."""
    path = path_of(name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise StaleResult(f"{_shown(path)} is broken ({type(e).__name__}): "
                          f"{rerun_hint(name)}") from None
    if not isinstance(data, dict):
        raise StaleResult(f"{_shown(path)} is broken (not a JSON object): {rerun_hint(name)}")
    return data


def parse(name: str, data: dict):
    """A saved dict as its record, or StaleResult (one line) if this lab cannot read it."""
    if data.get("lab_results") != LAB_RESULTS:
        raise StaleResult(f"{_shown(path_of(name))} was written by an older lab: "
                          f"{rerun_hint(name)}")
    try:
        return record_of(name).from_dict(data)
    except ValueError as e:
        raise StaleResult(f"{_shown(path_of(name))} was written by an older lab ({e}): "
                          f"{rerun_hint(name)}") from None


def load(name: str):
    """results/<name>.json as its record; None if it was never saved; StaleResult (one line)
    if it was written by an older lab or is broken."""
    data = load_raw(name)
    return None if data is None else parse(name, data)


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
