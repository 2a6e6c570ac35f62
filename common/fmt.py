"""One way to say a figure, for every report: a ratio with its range, milliseconds, seconds, a
percentage, and two figures compared with their verdict. '-' stands for what was not measured.

    times(1.234)                        '1.23x'
    times_range(spread, "static")       '1.65x static (1.58-1.71)'
    ms(0.0213)                          '21.3'
    secs(1.5)                           '1.50'
    pct(0.374)                          '37%'
    twins(a, b, "tok/s")                '46.6 against 38.6 tok/s: they DISAGREE, 1.21x apart
                                         (over the lab's 10%)'
    alike([36.7, 45.9, 60.4], "tok/s")  '36.7, 45.9 and 60.4 tok/s: they DISAGREE, 1.65x apart
                                         (over the lab's 10%)'
"""
from __future__ import annotations

from dataclasses import dataclass

from common import measure

NONE = "-"


def times(value: float | None, digits: int = 2) -> str:
    """A ratio: '1.23x'."""
    return NONE if value is None else f"{value:.{digits}f}x"


def times_range(spread: measure.Spread | None, what: str = "", digits: int = 2) -> str:
    """A ratio measured in passes: the median with the range of the passes, '1.65x static
    (1.58-1.71)'; one pass: '1.65x static'."""
    if spread is None:
        return NONE
    text = times(spread.median, digits) + (f" {what}" if what else "")
    if spread.num_passes < 2:
        return text
    return f"{text} ({spread.low:.{digits}f}-{spread.high:.{digits}f})"


def ms(seconds: float | None, digits: int = 1) -> str:
    """Seconds said in milliseconds, without the unit (the label carries it): '21.3'."""
    return NONE if seconds is None else f"{1000 * seconds:.{digits}f}"


def secs(seconds: float | None, digits: int = 2) -> str:
    """Seconds, without the unit: '1.50'."""
    return NONE if seconds is None else f"{seconds:.{digits}f}"


def pct(fraction: float | None, digits: int = 0) -> str:
    """A share: 0.374 -> '37%'."""
    return NONE if fraction is None else f"{100 * fraction:.{digits}f}%"


@dataclass
class Twins:
    """One quantity measured twice in one run, and whether the two agree (measure.AGREE_WITHIN
    of each other's medians): the verdict every report and the summary give twins."""
    a: float
    b: float

    @property
    def ratio(self) -> float:
        return self.a / self.b if self.b else float("inf")

    @property
    def agree(self) -> bool:
        return bool(self.a and self.b) and measure.within(self.a, self.b)

    def verdict(self, short: bool = False) -> str:
        """'they agree (within the lab's 10%)'; short, where the tolerance is said once above
        (the summary): 'they agree'."""
        tolerance = "" if short else f" (over the lab's {measure.AGREE_WITHIN:.0%})"
        if self.agree:
            return "they agree" if short else \
                f"they agree (within the lab's {measure.AGREE_WITHIN:.0%})"
        apart = max(self.ratio, 1 / self.ratio) if self.a and self.b else float("inf")
        return f"they DISAGREE, {apart:.2f}x apart{tolerance}"


def twins(a: float | measure.Spread, b: float | measure.Spread, unit: str = "",
          digits: int = 1, short: bool = False) -> str:
    """'46.6 against 38.6 tok/s: they DISAGREE, 1.21x apart (over the lab's 10%)': two figures
    of one quantity (a Spread says its median), compared by their medians."""
    a_value = a.median if isinstance(a, measure.Spread) else a
    b_value = b.median if isinstance(b, measure.Spread) else b
    unit = f" {unit}" if unit else ""
    return (f"{a_value:,.{digits}f} against {b_value:,.{digits}f}{unit}: "
            + Twins(a_value, b_value).verdict(short))


def alike(figures: list[float | measure.Spread], unit: str = "", digits: int = 1,
          short: bool = False) -> str:
    """Three or more figures of one quantity: '36.7, 45.9 and 60.4 tok/s: they DISAGREE, 1.65x
    apart (over the lab's 10%)', the verdict of the slowest against the fastest."""
    values = [f.median if isinstance(f, measure.Spread) else f for f in figures]
    said = [f"{v:,.{digits}f}" for v in values]
    unit = f" {unit}" if unit else ""
    listed = ", ".join(said[:-1]) + " and " + said[-1] if len(said) > 1 else said[0]
    return f"{listed}{unit}: " + Twins(max(values), min(values)).verdict(short)
