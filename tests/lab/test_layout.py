"""The house rules of the code's layout, checked on the source itself: no import circle,
mini_engine on its own, the arrows pointing down (no module below the scripts imports one, and no
script another, by an import statement or by importlib), every step declaring what the lab reads
of it, a lesson's parts in one package beside its script; and tests that stand on
tests/helpers.py, tests/conftest.py and tests/hand/, never on another test file."""
from __future__ import annotations

import ast
import fnmatch
import re
import shutil
from pathlib import Path

import pytest

from common import report, steps
from tests.helpers import REPO
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


# --- the arrows point down: scripts import the packages, never the other way --------------------
BELOW_THE_SCRIPTS = ("common", "lessons", "mini_engine")


def top_level_scripts() -> set[str]:
    """The repository's own scripts at its root, by module name: what a learner runs."""
    return {p.stem for p in REPO.glob("*.py")
            if p.name.startswith("task_") or p.name in ("summary.py", "lab.py",
                                                         "verify_environment.py")}


IMPORT_CALLS = ("import_module", "__import__")   # importlib.import_module, bare, or __import__


def script_imports(source: str, scripts: set[str], module: str = "") -> list[str]:
    """Where source imports a top-level script, by any means: an import statement, or a call of
    importlib.import_module or __import__ whose name is one, or may be one. A name built at run
    time is followed as far as the source spells it: a constant, an f-string (f"lessons.{n}"
    names a module of lessons/, never a script), a loop variable over constants, a property of
    the same class that returns one of these; a name it cannot follow (an argument, a computed
    attribute) counts, as it may name a script. module: the source's own dotted name, for
    {__name__}. One line per import found: "line N: <what it imports>"."""
    tree = ast.parse(source)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {node.module or ""} if node.level == 0 else set()
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in IMPORT_CALLS):
            names = possible_values(node.args[0], module)
        else:
            continue
        if names is None:
            found.append(f"line {node.lineno}: a name the check cannot follow "
                         f"({ast.unparse(node)})")
            continue
        for name in sorted(names):
            top = name.split(".")[0]   # "" for a relative name: a module of its own package
            if top and any(fnmatch.fnmatchcase(script, top) for script in scripts):
                found.append(f"line {node.lineno}: {name}")
    return found


def possible_values(node: ast.AST, module: str) -> set[str] | None:
    """The strings an expression can hold, as far as the source spells them; "*" stands for a
    part it does not; None where it cannot tell at all."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.JoinedStr):
        values = {""}
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                known = possible_values(part.value, module) if (
                    isinstance(part.value, ast.Name) and part.value.id == "__name__") else {"*"}
            else:
                known = possible_values(part, module)
            values = {a + b for a in values for b in known}
        return values
    if isinstance(node, ast.Name):
        return {module} if node.id == "__name__" and module else bound_values(node, module)
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "self"):
        return property_values(node, module)
    return None


def enclosing(node: ast.AST, kind) -> ast.AST | None:
    while (node := getattr(node, "parent", None)) is not None and not isinstance(node, kind):
        pass
    return node


def bound_values(name: ast.Name, module: str) -> set[str] | None:
    """What a variable holds: every value the function around it (else the module) binds to it,
    by `for name in (constants)` or `name = ...`; None if any cannot be told, or none is
    bound there (an argument)."""
    scope = enclosing(name, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))
    values, bound = set(), False
    for node in ast.walk(scope):
        if isinstance(node, ast.For):
            unpacked = isinstance(node.target, ast.Tuple)
            items = node.iter.elts if isinstance(node.iter, (ast.Tuple, ast.List)) else None
            for i, target in enumerate(node.target.elts if unpacked else [node.target]):
                if not (isinstance(target, ast.Name) and target.id == name.id):
                    continue
                bound = True
                if items is None:
                    return None
                for item in items:
                    if unpacked and not isinstance(item, (ast.Tuple, ast.List)):
                        return None
                    more = possible_values(item.elts[i] if unpacked else item, module)
                    if more is None:
                        return None
                    values |= more
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name.id for t in node.targets):
                bound = True
                more = possible_values(node.value, module)
                if more is None:
                    return None
                values |= more
    return values if bound else None


def property_values(attr: ast.Attribute, module: str) -> set[str] | None:
    """What self.<name> holds, where the class around it says: what its method (a property) of
    that name returns, or the class attribute of that name."""
    cls = enclosing(attr, ast.ClassDef)
    for node in cls.body if cls is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == attr.attr:
            returns = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
            values = [possible_values(r, module) for r in returns]
            return None if not values or None in values else set().union(*values)
        if (isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == attr.attr for t in node.targets)):
            return possible_values(node.value, module)
    return None


def script_imports_in(packages: tuple[str, ...], *, scripts_too: bool) -> dict[str, list[str]]:
    """Every module of packages (and, scripts_too, every top-level script) that imports a
    top-level script, with where it does: a script importing itself counts too."""
    scripts = top_level_scripts()
    files = {name: path for name, path in project_modules().items()
             if name.split(".")[0] in packages}
    if scripts_too:
        files |= {name: REPO / f"{name}.py" for name in scripts}
    found = {}
    for name, path in sorted(files.items()):
        lines = script_imports(path.read_text(), scripts, name)
        if lines:
            found[str(path.relative_to(REPO))] = lines
    return found


def test_no_module_below_the_scripts_imports_one():
    """The arrows point down: scripts import common/, lessons/ and mini_engine/, never the other
    way, neither by an import statement nor through importlib. common/steps.py names each
    script by its file and reads what the lab needs of it from its lesson's package."""
    assert script_imports_in(BELOW_THE_SCRIPTS, scripts_too=False) == {}


def test_no_top_level_script_imports_another():
    """Each script runs on its own; what two share lives in a package below them. (A script
    importing a library by name, as verify_environment.py does, is no script's import.)"""
    assert script_imports_in((), scripts_too=True) == {}


def test_the_script_import_check_catches_every_way():
    """The two rules above can fail: each way of importing a script is caught, and what is no
    script (a library, a package's module, a relative name) is not."""
    scripts = {"task_9_build_your_own_engine", "summary", "lab"}
    caught = ["import importlib\nimportlib.import_module('task_9_build_your_own_engine')\n",
              "from importlib import import_module\nimport_module('summary')\n",
              "__import__('lab')\n",
              "import task_9_build_your_own_engine\n",
              "from summary import FIGURES\n",
              "import importlib\nimportlib.import_module(f'task_{9}_build_your_own_engine')\n",
              "import importlib\ndef lesson(step):\n"
              "    return importlib.import_module(step.name)\n",
              "import importlib\nfor n in ('torch', 'lab'):\n    importlib.import_module(n)\n",
              "import importlib\nclass Step:\n    @property\n    def name(self):\n"
              "        return self.script.removesuffix('.py')\n"
              "    def lesson(self):\n        return importlib.import_module(self.name)\n"]
    for source in caught:
        assert script_imports(source, scripts), source
    passed = ["import importlib\nimportlib.import_module('torch')\n",
              "import importlib\nfor name in ('torchvision', 'torchaudio'):\n"
              "    importlib.import_module(name)\n",
              "import importlib\nfor module, dist in (('gradio', 'gradio'), ('aiohttp', 'x')):\n"
              "    importlib.import_module(module)\n",
              "import importlib\nclass Step:\n    @property\n    def package(self):\n"
              "        return f'lessons.{self.name}'\n"
              "    def lesson(self):\n        return importlib.import_module(self.package)\n",
              "import importlib\nimportlib.import_module('.record', __package__)\n",
              "import importlib\nimportlib.import_module(f'{__name__}.part')\n",
              "from common import steps\nimport lessons.task_9\n"]
    for source in passed:
        assert script_imports(source, scripts, "lessons.task_9") == [], source


def test_the_report_page_reads_the_summary_from_its_package():
    """The summary is no step of the list, but common/steps.py names it (SUMMARY) the way it
    names a step, so the report page reads its record and figures from its lesson's package,
    lessons/summary/, as it reads every step's, and never imports summary.py."""
    summary = steps.SUMMARY.lesson
    assert steps.SUMMARY not in steps.STEPS and steps.SUMMARY.name == "summary"
    assert steps.SUMMARY.package == summary.__name__ == "lessons.summary"
    assert steps.SUMMARY.record is summary.RECORD and steps.SUMMARY.figures == summary.FIGURES


def test_a_step_s_package_is_named_by_its_script():
    """lessons.task_9 for task_9_build_your_own_engine.py; the whole name for a script without
    a number."""
    by_name = steps.by_name()
    assert by_name["task_9_build_your_own_engine"].package == "lessons.task_9"
    assert by_name["task_14_quantized_kv"].package == "lessons.task_14"
    assert by_name["verify_environment"].package == "lessons.verify_environment"


def own_parts(package: Path) -> set[str]:
    """The parts a lesson's package declares as its own, beside the roles: OWN_PARTS = (...) in
    its __init__.py (read, not imported)."""
    for node in ast.parse((package / "__init__.py").read_text()).body:
        if (isinstance(node, ast.Assign)
                and [getattr(t, "id", None) for t in node.targets] == ["OWN_PARTS"]):
            return set(ast.literal_eval(node.value))
    return set()


def test_a_lesson_is_one_package_beside_its_script():
    """Every step of the lab (and the summary) has a package under lessons/, and every module
    under lessons/ is in one of those (common/steps.py: Step.package, lessons/task_<N>/ for
    task_<N>_*.py), named by its role (LESSON_ROLES) or declared as its lesson's own part
    (OWN_PARTS in the package's __init__.py, so a new task declares its parts where they live,
    and no test here changes); the package's docstring names the script and each part."""
    lessons = REPO / "lessons"
    assert [p.name for p in lessons.glob("*.py")] == ["__init__.py"], "lessons/ holds packages only"
    packages = sorted(p for p in lessons.iterdir() if p.is_dir() and p.name != "__pycache__")
    script_of = {step.package: step.script for step in [*steps.STEPS, steps.SUMMARY]}
    assert sorted(script_of) == [f"lessons.{p.name}" for p in packages], (
        "a step without a package under lessons/, or a package of no step")
    for package in packages:
        scripts = [script_of[f"lessons.{package.name}"]]
        assert (REPO / scripts[0]).is_file(), f"lessons/{package.name}/: no {scripts[0]}"
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


@pytest.mark.parametrize("step", steps.STEPS, ids=lambda s: s.name)
def test_a_step_declares_what_the_lab_reads_of_it(step):
    """Its record's type, its row of the summary, and its figures (a suffix and a drawing
    function each): what the lab, the summary and the report page read of every step."""
    lesson = step.lesson
    assert isinstance(lesson.RECORD, type) and callable(lesson.summary_row)
    assert all(isinstance(suffix, str) and callable(draw) for suffix, draw in step.figures)


# --- the tests' own layout ------------------------------------------------------------------------
def imported_test_modules(path: Path, tests_dir: Path) -> set[str]:
    """The test modules (test_*.py in any room of tests/) that a file under tests/ imports,
    anywhere in it, by whichever form: by its dotted name under the package tests (imported, or
    taken from its room), relative (from . or from ..room), or by its bare name. Named by their
    stem. tests/helpers.py, tests/conftest.py and the records of tests/hand/ are no test modules:
    importing them is how tests share."""
    names = {p.stem for p in tests_dir.rglob("test_*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            modules = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {part for module in modules for part in module.split(".") if part in names}
    return found - {path.stem}


def imports_between_tests(tests_dir: Path) -> dict[str, set[str]]:
    """Every file under tests_dir (test files, helpers.py, conftest.py, tests/hand/) that
    imports a test module, with the ones it imports."""
    found = {}
    for path in sorted(tests_dir.rglob("*.py")):
        imported = imported_test_modules(path, tests_dir)
        if imported:
            found[path.relative_to(tests_dir).as_posix()] = imported
    return found


def test_no_test_module_imports_another():
    """Tests stand on tests/helpers.py (shared helpers), tests/conftest.py (fixtures) and
    tests/hand/ (records built by hand), never on each other: a test file can be moved, split or
    deleted alone."""
    assert imports_between_tests(REPO / "tests") == {}


def test_the_test_import_rule_catches_a_test_importing_another(tmp_path):
    """The rule above can fail: a copy of tests/ where one test file imports another, in each
    form of import, within its room and across rooms, is caught; importing helpers.py or
    tests/hand/ is not."""
    copy = tmp_path / "tests"
    shutil.copytree(REPO / "tests", copy, ignore=shutil.ignore_patterns("__pycache__", "data"))
    assert imports_between_tests(copy) == {}
    pkg = "tests"   # (spelled apart: a grep for such imports finds none in tests/)
    breaking = [f"from {pkg}.tasks.test_task_9 import HAND", f"import {pkg}.tasks.test_task_10",
                f"from {pkg}.tasks import test_tasks_6_7", "import test_task_11",
                "from . import test_task_12", "def f():\n    from test_lab import lab\n",
                "from ..engine import test_engine", "from .test_task_13 import SUMMARY_ROW"]
    for i, line in enumerate(breaking):
        (copy / "tasks" / f"test_throwaway_{i}.py").write_text(
            f"from tests import hand\nfrom tests.helpers import REPO\n{line}\n")
    (copy / "hand" / "task_99_throwaway.py").write_text(
        f"from {pkg}.lab.test_summary import SMOLLM\n")
    assert imports_between_tests(copy) == {
        "tasks/test_throwaway_0.py": {"test_task_9"}, "tasks/test_throwaway_1.py": {"test_task_10"},
        "tasks/test_throwaway_2.py": {"test_tasks_6_7"},
        "tasks/test_throwaway_3.py": {"test_task_11"},
        "tasks/test_throwaway_4.py": {"test_task_12"}, "tasks/test_throwaway_5.py": {"test_lab"},
        "tasks/test_throwaway_6.py": {"test_engine"}, "tasks/test_throwaway_7.py": {"test_task_13"},
        "hand/task_99_throwaway.py": {"test_summary"}}


def test_a_test_carries_its_xdist_group(request):
    """Under pytest.ini's --dist loadgroup, a worker names every test's group after its id
    (helpers.name_its_group), so xdist keeps a file's tests, and the lab's checks, together; a
    file's group is its path under tests/ (helpers.file_group). Without it every test is dealt
    out alone, and the lab runs once per worker."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not on an xdist worker with --dist loadgroup (pytest -n 0)")
    assert request.node.nodeid.endswith("@lab/test_layout.py"), request.node.nodeid


def test_every_term_a_report_defines_is_a_glossary_entry():
    """report.term's few words stand for an entry of docs/glossary.md, where the term is said in
    full: each TERMS key is inside one entry's bold name."""
    glossary = (REPO / "docs" / "glossary.md").read_text()
    names = re.findall(r"^- \*\*(.+?)\*\*", glossary, flags=re.M)
    for term in report.TERMS:
        assert any(term in name for name in names), f"{term!r} is not in docs/glossary.md"
