"""The engine's layout, read from the code's own import statements: imports run one way. No module of dart_core
imports, directly or through others, a module that imports it back; `dart_core/machine/` sits below the rest of the
engine; and the engine (the decoding core at the package root, `machine/`, `budget/`, `formats/`, `forensics/`) never
imports the set-up, the tools, the training, the views or the app. Two root files are exempt, as docs/architecture.md
says: `api.py` (the Python API sits on the set-up) and `__main__.py` (the command line's entry point), with the
package's `__init__.py` that re-exports the API."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENGINE_FOLDERS = ("machine", "budget", "formats", "forensics")
ABOVE_THE_ENGINE = ("dart_core.setup", "dart_core.tools", "dart_core.training", "dart_core.views", "app")
ON_THE_SET_UP = {"dart_core", "dart_core.api", "dart_core.__main__"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "dart_core").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _known(name: str) -> str | None:
    """The dart_core module `name` is, or lies in (a name imported from a module); None outside dart_core."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The dart_core modules `module` names in an import statement, wherever in the file."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]   # a module of a package, or a name in a module
        else:
            continue
        found |= {m for m in map(_known, names) if m is not None and m != module}
    return found


IMPORTS = {m: _imports(m) for m in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle among the modules, or None (a depth-first walk that meets a module still on its path)."""
    state: dict[str, int] = {}   # 1: on the current path, 2: done

    def walk(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(IMPORTS[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [m, n] if n in path else [m, n]
            if n not in state and (found := walk(n, path + [m])):
                return found
        state[m] = 2
        return None

    for m in sorted(MODULES):
        if m not in state and (found := walk(m, [])):
            return found
    return None


def _in(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_reading_of_imports_sees_the_engines_own_edges():
    # relative, nested and absolute forms all resolve (so the tests below cannot pass by reading nothing)
    assert "dart_core.machine.records" in IMPORTS["dart_core.trace"]
    assert "dart_core.budget.pool" in IMPORTS["dart_core.forensics.misses"]
    assert "dart_core.views.figures" in IMPORTS["dart_core.views.report"]
    assert "dart_core.budget.pool" in IMPORTS["dart_core.views.figures"]
    assert "dart_core.tools.cli" in IMPORTS["dart_core.__main__"]


def test_no_module_imports_itself_back():
    assert _cycle() is None


def test_the_machine_imports_nothing_else_of_the_engine():
    outside = {m: sorted(n for n in IMPORTS[m] if not _in(n, ["dart_core.machine"]))
               for m in MODULES if _in(m, ["dart_core.machine"])}
    assert len(outside) >= 4 and not any(outside.values()), outside


def test_the_engine_imports_nothing_above_it():
    engine = [m for m in MODULES if m not in ON_THE_SET_UP and not _in(m, ABOVE_THE_ENGINE)]
    assert {f"dart_core.{f}" for f in ENGINE_FOLDERS} <= set(engine) and "dart_core.decoding" in engine
    upward = {m: sorted(n for n in IMPORTS[m] if _in(n, ABOVE_THE_ENGINE)) for m in engine}
    assert not any(upward.values()), {m: n for m, n in upward.items() if n}


def test_a_cycle_would_be_found():
    IMPORTS["dart_core.errors"].add("dart_core.decoding")   # decoding imports errors: now a cycle
    try:
        found = _cycle()
    finally:
        IMPORTS["dart_core.errors"].discard("dart_core.decoding")
    assert found is not None and found[0] == found[-1] and "dart_core.errors" in found
