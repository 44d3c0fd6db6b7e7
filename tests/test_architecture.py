"""The package's layering, read from the source with :mod:`ast` (nothing is imported).

- No import cycle among musku's modules: every import counts, at module level, inside a
  function or under ``TYPE_CHECKING`` (a cycle that only a lazy import hides is still a cycle
  in the design).
- Display code (rich) only in the CLI layer: the library reports progress through callbacks.
- Few function-local imports outside the CLI modules, each with its reason: at most
  :data:`LOCAL_IMPORT_LIMIT` of them (standard library, third-party and musku's own alike), and
  a comment on every one.

The layers themselves are import-linter's contracts (``[tool.importlinter]`` in pyproject.toml,
``lint-imports`` in scripts/test).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import musku

ROOT = Path(musku.__file__).resolve().parent

# the CLI layer: the only modules that may import rich (they parse arguments, call the library
# and render its results)
DISPLAY_MODULES = {
    "musku.cli",
    "musku.display",  # the CLI's renderer: live progress of a sweep, the read commands' tables
    "musku.agent.cli",
    "musku.knobs.cli",
    "musku.qsim.cli",
    "musku.services.cli",
    "musku.tune.cli",
}
DISPLAY_LIBRARIES = ("rich",)

# the CLI modules load the library per command (``musku --help`` stays fast): their
# function-local imports are the rule, not counted
CLI_MODULES = DISPLAY_MODULES | {"musku.entry", "musku.__main__"}
# function-local imports outside the CLI modules, of any module (docs/architecture.md,
# "Layers"): each one hides an edge of the import graph from a reader of the module's top, and
# is kept only where it spares a real import-time cost (numpy, scipy, pydantic, SQLAlchemy...)
# on a path that must stay light, or an optional dependency (31: scipy.stats' binom in
# musku/services/latency.py, 0.9 of `musku check`'s 2.1 CPU-s, which every CLI test process paid)
LOCAL_IMPORT_LIMIT = 31


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, mods: Collection[str] = ()) -> Iterator[tuple[str, int]]:
    """(imported name, line) for every import in the module, wherever it stands. ``from X
    import Y`` imports the module ``X.Y`` when there is one (in ``mods``), else a name of ``X``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in mods else target), node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported musku module: line of the first such import}."""
    mods = modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges: dict[str, int] = {}
        for target, line in imports(name, path, mods):
            if target in mods and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected component of more than one module
    (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [shortest_cycle(graph, set(c)) for c in components]


def shortest_cycle(graph: dict[str, dict[str, int]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in graph[node]:
                if child not in component:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    following.append(child)
        frontier = following
    return sorted(component)  # not reached: a strongly connected component has a cycle


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return " -> ".join([*steps, cycle[-1]])


def test_the_graph_is_read() -> None:
    """The walker sees the package (a broken walker would find no cycle in an empty graph)."""
    graph = import_graph()
    assert "musku.cli" in graph and "musku.domain" in graph
    assert "musku.errors" in graph["musku.cli"]
    assert sum(len(e) for e in graph.values()) > 200


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert describe(graph, ["a", "b", "c", "a"]) == "a (line 1) -> b (line 2) -> c (line 3) -> a"
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = [describe(graph, c) for c in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def test_display_code_only_in_the_cli_layer() -> None:
    mods = modules()
    assert set(mods) >= DISPLAY_MODULES, DISPLAY_MODULES - set(mods)
    offenders = [
        f"{name}:{line} imports {target}"
        for name, path in mods.items()
        if name not in DISPLAY_MODULES
        for target, line in imports(name, path)
        if target.split(".")[0] in DISPLAY_LIBRARIES
    ]
    assert not offenders, "display code outside the CLI layer:\n" + "\n".join(offenders)


def test_lazy_and_type_checking_imports_count(tmp_path: Path) -> None:
    """An import inside a function or under ``TYPE_CHECKING`` is an edge like any other."""
    path = tmp_path / "mod.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from musku.storage import store\n"
        "def f():\n"
        "    from musku.sweep.sweep import open_pair\n"
        "    import musku.sim.model\n"
    )
    mods = {"musku.storage.store", "musku.sweep.sweep", "musku.sim.model"}
    found = dict(imports("musku.x", path, mods))
    assert found["musku.storage.store"] == 3
    assert found["musku.sweep.sweep"] == 5
    assert found["musku.sim.model"] == 6


def local_imports(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, imported module, has a reason comment) for every import inside a function; the
    reason is a comment in its block of consecutive imports, or on the line above the block."""
    text = path.read_text()
    lines = text.splitlines()
    seen: set[int] = set()
    for fn in ast.walk(ast.parse(text, str(path))):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in seen:
                continue
            seen.add(node.lineno)  # a nested function's import is walked twice
            if isinstance(node, ast.Import):
                target = node.names[0].name
            else:
                target = "musku." if node.level else node.module or ""
            above = node.lineno - 2  # the line above the block of imports this one ends
            while above >= 0 and lines[above].strip().startswith(("import ", "from ")):
                above -= 1
            block = lines[above + 1 : node.end_lineno or node.lineno]
            reason = any("#" in line for line in block) or lines[above].strip().startswith("#")
            yield node.lineno, target, reason


def test_the_local_import_finder(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text(
        "import os\n"
        "def f():\n"
        "    import json  # lazy: a reason\n"
        "    def g():\n"
        "        # lazy: the reason for the next line\n"
        "        from musku.storage import store\n"
        "        import musku.sim.model\n"
        "    x = 1\n"
        "    from . import sibling\n"
        "    return g\n"
    )
    assert sorted(local_imports(path)) == [
        (3, "json", True),
        (6, "musku.storage", True),
        (7, "musku.sim.model", True),
        (9, "musku.", False),
    ]


def test_function_local_imports_are_few_and_explained() -> None:
    found = [
        (f"{name}:{line}", target, reason)
        for name, path in modules().items()
        if name not in CLI_MODULES and not name.endswith(".cli")
        for line, target, reason in local_imports(path)
    ]
    assert len(found) > 10  # the finder sees them (an empty list would pass anything)
    assert len(found) <= LOCAL_IMPORT_LIMIT, (
        f"{len(found)} function-local imports outside the CLI (limit {LOCAL_IMPORT_LIMIT}): "
        "import at module level\n" + "\n".join(f"{where} imports {t}" for where, t, _ in found)
    )
    unexplained = [f"{where} imports {target}" for where, target, reason in found if not reason]
    assert not unexplained, "function-local imports without a reason comment:\n" + "\n".join(
        unexplained
    )


def test_check_of_a_sim_experiment_loads_no_database_library() -> None:
    """`musku check` needs no results DB: SQLAlchemy and alembic (~0.6 CPU-s with their
    dependencies) stay out of it. A module-level `from musku.storage import open_store`
    (musku.storage serves it lazily, so the import itself loads the store) once put them there
    through the sim backend's trainer: `musku check` cost 1.5 CPU-s more. Nor does it run a
    simulation nor trains a threading table: scipy.signal (the sim's AR(1) filter,
    musku/sim/noise.py) and scipy.stats (the latency quantiles' binom) stay out too: they were
    0.8-0.9 of `musku check`'s 2.0-2.1 CPU-s (1.2-1.3 without them)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from musku.cli import main\n"
        "try:\n    main(['check', sys.argv[1]])\n"
        "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
        "print('LOADED', *sorted(m for m in ('sqlalchemy', 'alembic', 'scipy.signal', 'scipy.stats') "
        "if m in sys.modules))"
    )
    exp = ROOT.parent / "experiments" / "web-skylake.toml"
    p = subprocess.run([sys.executable, "-c", code, str(exp)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT.parent)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "LOADED", p.stdout[-2000:]
