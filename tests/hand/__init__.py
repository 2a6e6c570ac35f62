"""Results written by hand for the tests of the summary, the figures and the report page: a
record with the fields a test names, every other field it requires at its type's zero (0, "",
[], None, a nested record filled the same way), saved the way a task saves it."""
from __future__ import annotations

import dataclasses
import types
import typing

from common import results


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
