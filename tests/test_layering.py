"""The import rules of docs/architecture.md ("Layers"), checked by reading the source
(``ast``; nothing is imported): data flows app -> core -> kvcache -> mlx, the benchmarks
(bench/) sit on top of the product and nothing of the product imports them, and no module
imports one that imports it back. Every ``import`` counts, at the top of a module or inside
a function (a circle through a lazy import is still a circle), ``if TYPE_CHECKING:`` ones
too."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "core", "kvcache", "bench")
PRODUCT = ("app", "core", "kvcache")  # what the app bundle ships; bench/ stays out of it
# the one benchmark that drives the window (radixchat bench gui): the only one that imports app
GUI_BENCH = "bench.gui"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, e.g. core.engine.engine
    target: str  # the imported module as written, resolved if relative, e.g. mlx.core
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.source.replace('.', '/')}.py:{self.line})"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: frozenset[str]) -> list[Import]:
    """Every import in ``path``; ``from package import name`` names the submodule
    ``package.name`` where that is one of ``modules``."""
    source = module_name(path)
    package = source if path.name == "__init__.py" else source.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [Import(source, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(source, sub if sub in modules else base, node.lineno))
    return found


@lru_cache(maxsize=1)
def all_imports() -> tuple[Import, ...]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = frozenset(module_name(p) for p in files)
    return tuple(imp for p in files for imp in imports_of(p, modules))


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def offending(importer: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        str(i) for i in all_imports() if _under(i.source, importer) and _under(i.target, forbidden)
    ]


def test_the_walk_sees_the_code():
    """Guards the tests below against passing on an empty walk."""
    targets = {(i.source, i.target) for i in all_imports()}
    assert any(s.startswith("core.") and t.startswith("kvcache.") for s, t in targets)
    assert any(s.startswith("kvcache.") and t.startswith("mlx") for s, t in targets)
    assert any(s.startswith("app.") and t.startswith("PySide6") for s, t in targets)
    assert any(s.startswith("bench.") and t.startswith("core.") for s, t in targets)


def test_kvcache_imports_neither_core_nor_app():
    bad = offending(("kvcache",), ("core", "app"))
    assert not bad, "kvcache must not import core or app:\n  " + "\n  ".join(bad)


def test_core_imports_neither_app_nor_pyside6():
    bad = offending(("core",), ("app", "PySide6"))
    assert not bad, "core must not import app or PySide6:\n  " + "\n  ".join(bad)


def test_app_imports_neither_mlx_nor_kvcache():
    bad = offending(("app",), ("mlx", "mlx_lm", "kvcache"))
    assert not bad, (
        "app must not import mlx, mlx_lm or kvcache (it reaches kvcache through core):\n  "
        + "\n  ".join(bad)
    )


def test_the_product_does_not_import_the_benchmarks():
    """bench/ is left out of the packaged app: the product reaches a benchmark only by its
    name (core/cli/commands/bench.py imports it with importlib when it runs)."""
    bad = offending(PRODUCT, ("bench",))
    assert not bad, "app, core and kvcache must not import bench:\n  " + "\n  ".join(bad)


def test_only_the_gui_bench_imports_the_app():
    """The benchmarks run headless on core and kvcache; ``bench gui`` alone drives the window."""
    bad = [
        str(i)
        for i in all_imports()
        if _under(i.source, ("bench",))
        and not _under(i.source, (GUI_BENCH,))
        and _under(i.target, ("app", "PySide6"))
    ]
    assert not bad, "only bench.gui may import app or PySide6:\n  " + "\n  ".join(bad)
    assert any(i.source == GUI_BENCH and _under(i.target, ("app",)) for i in all_imports())


def test_the_api_does_not_import_the_command_line():
    bad = offending(("core.api",), ("core.cli",))
    assert not bad, "the API must not import the command line:\n  " + "\n  ".join(bad)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: the components with more than one module, or one
    that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def test_strongly_connected_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["e"]]


def test_no_import_circles():
    imports = [i for i in all_imports() if _under(i.target, PACKAGES)]
    modules = {i.source for i in all_imports()} | {i.target for i in imports}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in imports:
        graph[i.source].add(i.target)
    circles = strongly_connected(graph)
    lines = []
    for members in circles:
        inside = set(members)
        lines.append("circle: " + ", ".join(members))
        lines += [f"    {i}" for i in imports if i.source in inside and i.target in inside]
    assert not circles, "modules that import each other (directly or round a loop):\n" + "\n".join(
        lines
    )
