"""What one module may touch of another is what it exports (docs/architecture.md, "Style"),
checked by reading the code (app/, core/, kvcache/ and the benchmarks, bench/) with ``ast``;
nothing is imported. No module imports another module's ``_private`` name or a ``_private``
module of ours, and none reaches ``obj._name`` on an object other than
``self``/``cls``/``super()`` unless that name is its own. The check goes by names, not
types: ``other._x`` passes only where this module alone defines ``_x`` (in a class, or by
setting it on an object). Tests may touch privates; the private names of other libraries
(mlx, mlx-lm) are gathered in the compat modules (``COMPAT``)."""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.test_layering import PACKAGES, ROOT

# Where other libraries' private names are used, on purpose and in one place each.
COMPAT = frozenset({"core/mlx_lm_compat.py", "core/mlx_compat.py"})
# Private in name only: documented API of the standard library.
STDLIB = frozenset({"os._exit"})


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def private_imports(path: str, source: str) -> list[str]:
    """``from x import _y`` and imports of a private module, where x is one of ours (a
    relative import always is)."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            found += [
                f"{path}: import {alias.name}"
                for alias in node.names
                if ours(alias.name) and any(map(private, alias.name.split(".")))
            ]
        elif isinstance(node, ast.ImportFrom) and (node.level or ours(node.module or "")):
            module = "." * node.level + (node.module or "")
            if any(map(private, (node.module or "").split("."))):
                found.append(f"{path}: from {module} import ...")
            found += [
                f"{path}: from {module} import {alias.name}"
                for alias in node.names
                if private(alias.name)
            ]
    return found


def _is_own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def _reaches(tree: ast.AST) -> list[tuple[ast.expr, str, bool]]:
    """Every attribute reach in ``tree``: (the object, the name, whether it is a store),
    ``getattr``/``setattr``/``hasattr``/``delattr`` with a constant name included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            found.append((node.value, node.attr, isinstance(node.ctx, ast.Store)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            found.append((node.args[0], node.args[1].value, node.func.id == "setattr"))
    return found


def defined_names(tree: ast.AST) -> set[str]:
    """The private attribute names a module defines: in its classes' bodies, or set on an
    object (``self``, or another object it tags)."""
    names = {obj_name for _, obj_name, store in _reaches(tree) if store}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in names if private(name)}


def private_reaches(sources: dict[str, str]) -> list[str]:
    """``obj._name`` (obj not self/cls/super()) in each module of ``sources`` (path: text)
    where the name is not this module's alone: a name it defines (in a class, on ``self``,
    or as a tag it sets on other objects) that no other module defines. (Another instance
    of one of its own classes may be touched so, unless another module uses the name too:
    by its name alone, the object could then be that module's.)"""
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    definers: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        for name in defined_names(tree):
            definers[name].add(path)
    found = []
    for path, tree in trees.items():
        if path in COMPAT:
            continue
        for obj, name, _ in _reaches(tree):
            if not private(name) or _is_own(obj) or definers[name] == {path}:
                continue
            reach = f"{ast.unparse(obj)}.{name}"
            if reach not in STDLIB:
                found.append(f"{path}: {reach}")
    return found


def _class_privates(cls: ast.ClassDef) -> set[str]:
    """The private names a class body defines (methods, attributes)."""
    names = set()
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {name for name in names if private(name)}


def private_overrides(sources: dict[str, str]) -> list[str]:
    """A class that defines a ``_private`` name which a base class of another of our
    modules (imported by name: ``from core.x import Base``) defines too: a subclass that
    changes another module's private step. What a subclass may change is public (a hook)."""
    modules = {path.removesuffix(".py").replace("/", "."): path for path in sources}
    trees = {path: ast.parse(text, path) for path, text in sources.items()}
    classes = {
        (path, node.name): node
        for path, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }

    def imported(path: str) -> dict[str, tuple[str, str]]:
        """name in ``path`` -> (the module of ours it comes from, its name there)."""
        names = {}
        for node in ast.walk(trees[path]):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                for alias in node.names:
                    names[alias.asname or alias.name] = (modules[node.module], alias.name)
        return names

    def bases(path: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The classes of ours ``cls`` derives from, near or far, with their modules."""
        found = []
        names = imported(path)
        for base in cls.bases:
            if not isinstance(base, ast.Name):
                continue
            where = names.get(base.id, (path, base.id))
            parent = classes.get(where)
            if parent is not None and parent is not cls:
                found += [(where[0], parent), *bases(where[0], parent)]
        return found

    found = []
    for (path, name), cls in classes.items():
        for base_path, base in bases(path, cls):
            if base_path != path:
                found += [
                    f"{path}: {name}.{attr} overrides {base_path}: {base.name}.{attr}"
                    for attr in sorted(_class_privates(cls) & _class_privates(base))
                ]
    return found


def product_sources() -> dict[str, str]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in files}


def _check(found: list[str], what: str) -> None:
    new = sorted(set(found))
    assert not new, f"{what} (give the name a public one where it is defined):\n  " + "\n  ".join(
        new
    )


def test_product_code_imports_no_private_names_of_its_own_modules():
    found = [hit for path, text in product_sources().items() for hit in private_imports(path, text)]
    _check(found, "private names imported from another module")


def test_product_code_reaches_no_private_attributes_of_other_modules():
    _check(private_reaches(product_sources()), "private attributes of another module's objects")


def test_product_code_overrides_no_private_names_of_other_modules():
    _check(private_overrides(product_sources()), "private names overridden in another module")


def test_the_checks_find_what_they_look_for():
    """Guards the tests above against passing on a check that finds nothing."""
    imports = (
        "from core.b import _x, y\n"
        "import core._m\n"
        "from . import _z\n"
        "from mlx_lm.models import _w\n"
        "from core._m import v\n"
    )
    assert sorted(private_imports("core/a.py", imports)) == [
        "core/a.py: from . import _z",
        "core/a.py: from core._m import ...",
        "core/a.py: from core.b import _x",
        "core/a.py: import core._m",
    ]
    owner = "class Handle:\n    def _emit(self, e):\n        self._sent = e\n"
    user = (
        "def run(handle, other):\n"
        "    handle._emit(1)\n"  # another module's method: found
        "    other.x._sent\n"  # idem, through a chain
        "    getattr(handle, '_sent')\n"  # idem, by getattr
        "    handle.model._tag = 1\n"  # a tag this module puts on an object: fine
        "    return handle.model._tag\n"
        "class Mine:\n"
        "    def _step(self):\n"
        "        super()._step()\n"  # its own, through super(): fine
        "        self._count = 1\n"
        "    def same(self, twin):\n"
        # another instance of a class of this module: fine
        "        return twin._count + twin._step()\n"
        "import os\nos._exit(0)\n"
    )
    found = [
        "core/user.py: handle._emit",
        "core/user.py: handle._sent",
        "core/user.py: other.x._sent",
    ]
    assert sorted(private_reaches({"core/owner.py": owner, "core/user.py": user})) == found
    # a tag another module defines for its own class is that module's: found
    tagged = {"core/owner.py": owner + "class Model:\n    _tag = 0\n", "core/user.py": user}
    assert sorted(private_reaches(tagged)) == sorted(
        found + ["core/user.py: handle.model._tag"] * 2
    )
    # another instance of a class of this module, by a name another module uses too: found
    shared = {
        "core/owner.py": owner + "class Other:\n    def _step(self):\n        pass\n",
        "core/user.py": user,
    }
    assert sorted(private_reaches(shared)) == sorted(found + ["core/user.py: twin._step"])
    # the compat modules reach other libraries' privates on purpose
    assert private_reaches({"core/owner.py": owner, "core/mlx_lm_compat.py": user}) == []
    # a subclass in another module, near or far, may override public names only
    base = "class Engine:\n    def _run(self):\n        pass\n    def run(self):\n        pass\n"
    near = "from core.base import Engine\nclass Group(Engine):\n    def _run(self):\n        pass\n"
    far = "from core.group import Group\nclass Far(Group):\n    def _run(self):\n        pass\n"
    public = "from core.base import Engine\nclass Fine(Engine):\n    def run(self):\n        pass\n"
    same = base + "class Local(Engine):\n    def _run(self):\n        pass\n"
    assert sorted(
        private_overrides(
            {"core/base.py": same, "core/group.py": near, "core/far.py": far, "core/ok.py": public}
        )
    ) == [
        "core/far.py: Far._run overrides core/base.py: Engine._run",
        "core/far.py: Far._run overrides core/group.py: Group._run",
        "core/group.py: Group._run overrides core/base.py: Engine._run",
    ]


def test_the_walk_sees_the_code():
    sources = product_sources()
    assert (
        "core/engine/engine.py" in sources
        and "kvcache/store.py" in sources
        and "app/bridge.py" in sources
    )
