"""jepsen/'s import graph: no cycles (imports under TYPE_CHECKING and inside functions
included) and every import going down its floors, never back up.

The graph is read from the source with ``ast``, so it sees the imports a running process
may never execute (a lazy import in a command, a type-only import) as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jepsen

ROOT = Path(jepsen.__file__).resolve().parent

#: jepsen/'s floors, top to bottom: a module imports only from floors below its own, or
#: from its own package (whose modules must not import each other in a circle either);
#: packages side by side on one floor do not import each other
FLOORS: tuple[tuple[str, ...], ...] = (
    ("jepsen.__main__",),
    ("jepsen.cli",),
    ("jepsen.probe", "jepsen.run"),
    ("jepsen.workloads", "jepsen.faults"),
    ("jepsen.systems",),
    ("jepsen.net", "jepsen.docker"),
    ("jepsen.history",),
    ("jepsen.checker",),
)


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The jepsen modules ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # ``from package import module`` imports that module; ``from module import name`` the module
            targets = [
                f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import jepsen.x.y`` names a module too
                target = target.rpartition(".")[0]
            if target.startswith("jepsen") and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _floor(module: str) -> tuple[int, str]:
    for i, members in enumerate(FLOORS):
        for member in members:
            if module == member or module.startswith(member + "."):
                return i, member
    raise AssertionError(f"{module} is on no floor: add it to FLOORS")


def test_every_module_is_on_a_floor() -> None:
    for module in _graph():
        if module != "jepsen":
            _floor(module)


def test_jepsen_has_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*path, dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_imports_go_down_the_floors() -> None:
    upward = []
    for module, deps in sorted(_graph().items()):
        if module == "jepsen":
            continue
        floor, package = _floor(module)
        for dep in sorted(deps):
            dep_floor, dep_package = _floor(dep)
            if dep_package != package and dep_floor <= floor:
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports that do not go down a floor:\n" + "\n".join(upward)


def test_workloads_reach_systems_only_through_the_client_interface() -> None:
    """A workload talks to a system through ``systems.clients`` (and may refuse with
    ``systems.base.Unsupported``); it never imports a system's own module."""
    allowed = {"jepsen.systems.clients", "jepsen.systems.base"}
    for module, deps in _graph().items():
        if module.startswith("jepsen.workloads"):
            reached = {d for d in deps if d.startswith("jepsen.systems")}
            assert reached <= allowed, f"{module} imports {sorted(reached - allowed)}"
