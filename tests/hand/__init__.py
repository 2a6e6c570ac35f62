"""Results written by hand, for a task's own tests and for the lab-wide ones (the summary, the
figures, the report page).

Each step that has a hand-built record declares it in a module of its own here, named as the
step (tests/hand/task_9_build_your_own_engine.py), read top to bottom as its test file reads it:

    record(header=None)  its RECORD, every number worked out by hand (header: the run's, else the
                         module's own)
    SUMMARY_ROW          the row of the summary's table that record gives, typed in by hand

The lab-wide tests go over common/steps.py and take what is declared here (records(), save_all()),
so a new task's hand record is one module here, and no lab-wide test changes. A step without a
module is simply not among them. These are helpers, not tests: a test file imports them, never
another test file (tests/lab/test_layout.py).

For the rest, fill() writes a record with the fields a test names, every other field it requires
at its type's zero (0, "", [], None, a nested record filled the same way), and save() saves it the
way a task saves it."""
from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from pathlib import Path

from common import results, steps

HERE = Path(__file__).resolve().parent


def modules() -> dict[str, types.ModuleType]:
    """The hand-record module of every step that has one (tests/hand/<step>.py), in the order of
    common/steps.py, by the step's results name."""
    return {step.name: importlib.import_module(f"{__name__}.{step.name}")
            for step in steps.STEPS if (HERE / f"{step.name}.py").is_file()}


def records(header: results.RunHeader | None = None) -> dict[str, results.Result]:
    """Every step's hand-built record, by results name (header: every record's, else each
    module's own)."""
    return {name: module.record(header=header) for name, module in modules().items()}


def save_all(header: results.RunHeader | None = None) -> dict[str, results.Result]:
    """Save every hand-built record as its task saves it (results/<name>.json, stamped with when
    and where); returns them."""
    saved = records(header)
    for name, record in saved.items():
        results.save(name, record)
    return saved


def fill(cls, **given):
    """cls(**given), the fields not given and without a default set to their type's zero."""
    hints = typing.get_type_hints(cls)
    kwargs = dict(given)
    for f in dataclasses.fields(cls):
        if (f.init and f.name not in given and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            kwargs[f.name] = zero(hints[f.name])
    return cls(**kwargs)


def zero(hint):
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return None if type(None) in args else zero(args[0])
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return fill(hint)
    if origin in (list, tuple, dict):
        return origin()
    return {float: 0.0, int: 0, str: "", bool: False}.get(hint)


def save(name: str, cls, header: results.RunHeader | None = None, **given):
    """Fill a record and save it as results/<name>.json; returns the record."""
    record = fill(cls, **given)
    if header is not None:
        record.header = header
    results.save(name, record)
    return record


def assert_figure_reads_well(fig, record: results.Result, where: object = None) -> None:
    """Every figure: a title, a caption naming the dtype, the machine and the date, and on every
    axes that plots something an x or a y label with text (its tick labels do not count:
    matplotlib's list of them is never empty)."""
    from common import settings

    assert fig is not None, where
    assert fig.get_suptitle(), where
    caption = fig.get_supxlabel()
    assert record.header.dtype in caption and "cores" in caption, caption
    assert record.measured_at[:10] in caption and settings.cpu_model_name() in caption
    for ax in fig.axes:
        if ax.axison and ax.has_data():
            labels = [label for label in (ax.get_xlabel(), ax.get_ylabel()) if label.strip()]
            assert labels, (where, ax.get_title(), "no x or y label")
