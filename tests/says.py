"""assert_says: what an insight test asserts of a KEY INSIGHT line, its figures and its choice.

A KEY INSIGHT line is chosen from the figures it explains (STYLE.md: "if the figures had come
out the other way, would the sentence change?"). Its test checks two things: that the line states
the figures worked out by hand (each as the report formats it, unit included, in the order the
sentence gives them), and that the code took the branch those figures choose: a phrase that only
that branch's template prints is there, and the phrases that only the other branches print are
not. The words around them are not asserted: rewording a template breaks no test, while a figure
formatted otherwise, a figure of the wrong run or a condition turned round still does. Each
choice is tested both ways: a test with the figures that choose one branch, and one with the
figures that choose the other.

A helper of the tests, not a test module: pytest collects nothing here."""
from __future__ import annotations


def assert_says(line: str, *figures: str, branch: str | tuple[str, ...] = (),
                not_branch: str | tuple[str, ...] = ()) -> None:
    """Assert that line states each of figures in the given order (each found after the end of
    the one before it, so a figure stated twice is asserted twice); that branch, a phrase only
    the chosen branch's template prints (a tuple of them where the line makes more than one
    choice), is in it; and that no phrase of not_branch (those only the other branches print)
    is. The failure shows the line and everything missing or out of place, all at once."""
    branch, not_branch = phrases(branch), phrases(not_branch)
    assert all(figures) and all(branch) and all(not_branch), "an empty phrase asserts nothing"
    problems, at = [], 0
    for i, figure in enumerate(figures):
        found = line.find(figure, at)
        if found >= 0:
            at = found + len(figure)
        elif figure in line:
            after = repr(figures[i - 1]) if i else "the start"
            problems.append(f"figure {figure!r} is there, but not after {after}")
        else:
            problems.append(f"figure {figure!r} is missing")
    problems += [f"branch {phrase!r} is missing: the code chose another sentence"
                 for phrase in branch if phrase not in line]
    problems += [f"the other branch's {phrase!r} is there" for phrase in not_branch
                 if phrase in line]
    if problems:
        raise AssertionError(f"the insight line\n    {line!r}\n"
                             + "\n".join(f"  - {problem}" for problem in problems))


def phrases(given: str | tuple[str, ...]) -> tuple[str, ...]:
    """One phrase given bare, or several: a tuple of them (never a string's characters)."""
    return (given,) if isinstance(given, str) else tuple(given)
