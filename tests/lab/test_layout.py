"""The house rules of the code's layout (issue 22), checked on the source itself: no import
circle, mini_engine on its own, task scripts that read like a lesson, a lesson's parts in one
package beside its script, the summary and the report page reading attributes, not keys; and
tests that stand on tests/conftest.py and tests/hand/, never on another test file."""
from __future__ import annotations

import ast
import inspect
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from common import steps

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "mini_engine", "lessons", "benchmarks", "tools")
# A lesson's parts (lessons/task_<N>/) are named by their role, the same in every task...
LESSON_ROLES = ("record", "report", "figure", "workloads")
# ...and a task's own extra part by what it is, declared here


def project_modules() -> dict[str, Path]:
    """Every module of the project by its import name (top-level scripts, packages and their
    subpackages: lessons.task_9.record)."""
    found = {p.stem: p for p in REPO.glob("*.py")}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules this file imports, anywhere in it (inside functions too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        out |= {n for n in names if n in modules}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: every strongly connected part of more than one module
    (Tarjan's algorithm), and any module that imports itself."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1 or v in graph.get(v, ()):
                found.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def packages_above(name: str) -> set[str]:
    """'lessons.task_9.record' -> {'lessons', 'lessons.task_9'}."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_module_imports_a_module_that_imports_it_back():
    modules = project_modules()
    graph = {name: imports_of(path, modules) - packages_above(name)
             for name, path in modules.items()}
    # a package's module importing its own package's __init__ is how Python loads it, not a circle
    assert cycles(graph) == []


def test_mini_engine_imports_nothing_of_the_lab():
    modules = project_modules()
    for name, path in modules.items():
        if name.startswith("mini_engine"):
            lab = {m for m in imports_of(path, modules) if not m.startswith("mini_engine")}
            assert not lab, f"{path.name} imports {sorted(lab)}"


def test_no_module_of_common_imports_a_top_level_script():
    """The arrows point down: scripts import common/, never the other way. common/steps.py
    names each script by its file, and imports it by that name only when asked (Step.lesson)."""
    modules = project_modules()
    scripts = {p.stem for p in REPO.glob("*.py")}
    for name, path in modules.items():
        if name.split(".")[0] == "common":
            up = imports_of(path, modules) & scripts
            assert not up, f"common/{path.name} imports {sorted(up)}"


def test_the_report_page_reads_the_summary_by_its_name():
    """The summary is no step of the list, but common/steps.py names its script (SUMMARY) the
    way it names a step's, so the report page reads its record and figures without an import."""
    summary = steps.SUMMARY.lesson
    assert steps.SUMMARY not in steps.STEPS and steps.SUMMARY.name == summary.SCRIPT
    assert steps.SUMMARY.record is summary.RECORD and steps.SUMMARY.figures == summary.FIGURES


def own_parts(package: Path) -> set[str]:
    """The parts a lesson's package declares as its own, beside the roles: OWN_PARTS = (...) in
    its __init__.py (read, not imported)."""
    for node in ast.parse((package / "__init__.py").read_text()).body:
        if (isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["OWN_PARTS"]):
            return set(ast.literal_eval(node.value))
    return set()


def test_a_lesson_is_one_package_beside_its_script():
    """Every module under lessons/ is in a package lessons/task_<N>/ whose script task_<N>_*.py
    exists, named by its role (LESSON_ROLES) or declared as its task's own part (OWN_PARTS in
    the package's __init__.py, so a new task declares its parts where they live, and no test
    here changes); the package's docstring names the script and each part."""
    lessons = REPO / "lessons"
    assert [p.name for p in lessons.glob("*.py")] == ["__init__.py"], "lessons/ holds packages only"
    packages = sorted(p for p in lessons.iterdir() if p.is_dir() and p.name != "__pycache__")
    for package in packages:
        assert re.fullmatch(r"task_\d+", package.name), f"lessons/{package.name}/: not task_<N>"
        scripts = [p.name for p in REPO.glob(f"{package.name}_*.py")]
        assert len(scripts) == 1, f"lessons/{package.name}/ has no task script beside it"
        assert (package / "__init__.py").is_file(), f"lessons/{package.name}/ has no __init__.py"
        assert not [p for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"], (
            f"lessons/{package.name}/ holds modules only")
        parts = {p.stem for p in package.glob("*.py")} - {"__init__"}
        own = own_parts(package)
        assert all((package / f"{part}.py").is_file() for part in own), package.name
        allowed = set(LESSON_ROLES) | own
        assert parts <= allowed, f"lessons/{package.name}/: {sorted(parts - allowed)} not a role"
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        for name in [*scripts, *(f"{part}.py" for part in parts)]:
            assert name in docstring, f"lessons/{package.name}/__init__.py does not list {name}"


def main_length(path: Path) -> int:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            return node.end_lineno - node.lineno + 1
    return 0


@pytest.mark.parametrize("step", steps.STEPS, ids=lambda s: s.name)
def test_a_task_script_reads_like_a_lesson(step):
    """At most 320 lines, a main() of at most 45, and the three names the lab reads from it."""
    path = REPO / step.script
    assert len(path.read_text().splitlines()) <= 320
    assert main_length(path) <= 45
    lesson = step.lesson
    assert isinstance(lesson.RECORD, type) and callable(lesson.summary_row)
    assert all(isinstance(suffix, str) and callable(draw) for suffix, draw in step.figures)


def string_key_reads(source: str) -> int:
    """x["key"] and x.get("key") in source: how often it reads a dict by a string key."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)):
            count += 1
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            count += 1
    return count


def test_the_summary_figures_and_report_page_read_attributes():
    """Issue 22: at most 20 string-key reads in summary.py, the figures and the report page
    together (they were 73 + 122 + 6): the shared modules, and each task's figures and
    summary row wherever they live."""
    files = [REPO / "summary.py", REPO / "common" / "figures.py", REPO / "common" / "html_report.py",
             REPO / "common" / "roofline.py"]
    counts = {p.name: string_key_reads(p.read_text()) for p in files}
    for step in steps.STEPS:
        for fn in [step.lesson.summary_row, *(draw for _, draw in step.figures)]:
            counts[f"{step.name}.{fn.__name__}"] = string_key_reads(
                textwrap.dedent(inspect.getsource(fn)))
    assert sum(counts.values()) <= 20, counts


def test_the_key_counter_counts_keys():
    assert string_key_reads('r["a"] + r.get("b") + r[0] + r.attr + d.get(k)') == 2


# --- the tests' own layout -------------------------------------------------------------------------
def imported_test_modules(path: Path, tests_dir: Path) -> set[str]:
    """The test modules (tests/test_*.py) that a file under tests/ imports, anywhere in it, by
    whichever form: the module under the package tests (imported, or taken from the package),
    or by its bare name, as pytest's sys.path allows (imported, or relative). tests/conftest.py
    and the helpers of tests/hand/ are no test modules: importing them is how tests share."""
    names = {p.stem for p in tests_dir.glob("test_*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules = [base] + [f"{base}.{a.name}".lstrip(".") for a in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "tests":
                parts = parts[1:]
            if parts and parts[0] in names:
                found.add(parts[0])
    return found - {path.stem}


def imports_between_tests(tests_dir: Path) -> dict[str, set[str]]:
    """Every file under tests_dir (test files, conftest.py, tests/hand/) that imports a test
    module, with the ones it imports."""
    found = {}
    for path in sorted(tests_dir.rglob("*.py")):
        imported = imported_test_modules(path, tests_dir)
        if imported:
            found[str(path.relative_to(tests_dir))] = imported
    return found


def test_no_test_module_imports_another():
    """Tests stand on tests/conftest.py (fixtures, shared helpers) and tests/hand/ (records
    built by hand), never on each other: a test file can be moved, split or deleted alone."""
    assert imports_between_tests(REPO / "tests") == {}


def test_the_test_import_rule_catches_a_test_importing_another(tmp_path):
    """The rule above can fail: a copy of tests/ where one test file imports another, in each
    form of import, is caught; importing conftest.py or tests/hand/ is not."""
    copy = tmp_path / "tests"
    shutil.copytree(REPO / "tests", copy, ignore=shutil.ignore_patterns("__pycache__", "data"))
    assert imports_between_tests(copy) == {}
    pkg = "tests"   # (spelled apart: the grep for such imports finds none in tests/)
    breaking = [f"from {pkg}.test_task_9 import HAND", f"import {pkg}.test_task_10",
                f"from {pkg} import test_tasks_6_7", "import test_task_11",
                "from . import test_task_12", "def f():\n    from test_lab import lab\n"]
    for i, line in enumerate(breaking):
        (copy / f"test_throwaway_{i}.py").write_text(
            f"from tests import hand\nfrom tests.conftest import REPO\n{line}\n")
    (copy / "hand" / "task_99_throwaway.py").write_text(f"from {pkg}.test_summary import level\n")
    assert imports_between_tests(copy) == {
        "test_throwaway_0.py": {"test_task_9"}, "test_throwaway_1.py": {"test_task_10"},
        "test_throwaway_2.py": {"test_tasks_6_7"}, "test_throwaway_3.py": {"test_task_11"},
        "test_throwaway_4.py": {"test_task_12"}, "test_throwaway_5.py": {"test_lab"},
        "hand/task_99_throwaway.py": {"test_summary"}}


def test_a_test_carries_its_xdist_group(request):
    """Under pytest.ini's --dist loadgroup, a worker names every test's group after its id
    (conftest._name_its_group), so xdist keeps a file's tests, and the lab's checks, together.
    Without it every test is dealt out alone, and the lab runs once per worker."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on an xdist worker with --dist loadgroup (pytest -n 0)")
    assert request.node.nodeid.endswith("@test_layout.py"), request.node.nodeid
