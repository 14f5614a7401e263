"""No module of commlib reads or writes another module's underscore names (docs/architecture.md, "Internal
interface"): a plug-in or service that needs something of the runtime asks :mod:`commlib.lifecycle` or a
documented public attribute, never ``api._rt()``, ``sets._sets`` or ``state._bcast_object``.

What the check reads (AST, every file under commlib/):

- ``from X import _y`` where X is a commlib module and ``_y`` is not itself a module (a private module or a
  compiled extension such as ``commlib._kernels`` is a module, whose use the layer table governs);
- ``expr._y`` (read, write or delete) and ``getattr/setattr/hasattr/delattr(expr, "_y")`` where ``expr`` is
  not ``self``, ``cls`` or ``super()``.

Whose name is ``_y``: a module *defines* it when it has a ``def``/``class`` of that name, assigns it as a
variable, assigns it on ``self``/``cls`` or lists it in ``__slots__``; failing those, a module that assigns
it on some other object (a plug-in tagging a framework's object, ``wrapped._commlib_options = ...``) owns
it. An access is another module's when ``_y`` is defined elsewhere in commlib and not in the accessing
module (the check cannot know the object's type: a name both modules define counts as the module's own).

A framework's or the standard library's own private names (TensorFlow's ``gradtape._persistent``, Keras's
``_create_all_weights``, ``os._exit``) are not commlib's module boundary: no commlib module defines them,
so the check does not judge them. Such a use is the plug-in's bargain with that framework's version.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "commlib"
STRING_ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}

# Known cases that other streams of work are removing: (file, name) -> who removes it and how. Delete an
# entry when its work lands (test_the_allow_list_is_current fails on an entry that no longer matches).
KNOWN: dict[tuple[str, str], str] = {
}


def _layer_test():
    """tests/**/test_layers.py (wherever the test tree keeps it): its walk of the package and its list of
    the compiled extensions."""
    (path,) = ROOT.glob("tests/**/test_layers.py")
    spec = importlib.util.spec_from_file_location("layers_walk", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAYERS_TEST = _layer_test()


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_base(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the class's own attributes."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def definitions(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names the module defines, names it only assigns on other objects)."""
    strong, weak = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            strong.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            strong.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            (strong if _own_base(node.value) else weak).add(node.attr)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                  for t in node.targets):
            strong.update(c.value for c in ast.walk(node.value)
                          if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return strong, weak - strong


def _source_of(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _foreign_names(module: str, path: pathlib.Path, tree: ast.AST) -> set[str]:
    """Names the file binds to something imported from outside commlib (``os``, ``tf``, ``torch``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name != PACKAGE and not a.name.startswith(PACKAGE + "."))
        elif isinstance(node, ast.ImportFrom):
            source = _source_of(module, path.name == "__init__.py", node)
            if source != PACKAGE and not source.startswith(PACKAGE + "."):
                names.update(a.asname or a.name for a in node.names)
    return names


def accesses(module: str, path: pathlib.Path, tree: ast.AST, known_modules: set[str]):
    """(line, private name, how) for every private name the file takes from elsewhere: imports of another
    commlib module's name, and attribute accesses through anything but self/cls/super()."""
    foreign = _foreign_names(module, path, tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _source_of(module, path.name == "__init__.py", node)
            if source != PACKAGE and not source.startswith(PACKAGE + "."):
                continue
            for alias in node.names:
                if _is_private(alias.name) and f"{source}.{alias.name}" not in known_modules:
                    found.append((node.lineno, alias.name, f"from {source} import {alias.name}"))
        elif (isinstance(node, ast.Attribute) and _is_private(node.attr) and not _own_base(node.value)
              and not (isinstance(node.value, ast.Name) and node.value.id in foreign)):
            found.append((node.lineno, node.attr, ast.unparse(node)[:100]))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in STRING_ACCESSORS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)
              and not _own_base(node.args[0])):
            found.append((node.lineno, node.args[1].value, ast.unparse(node)[:100]))
    return found


def crossings(root: pathlib.Path = ROOT) -> list[tuple[str, int, str, str, list[str]]]:
    """(file, line, name, code, owners) for every access of a private name that another commlib module
    owns and the accessing module does not."""
    mods = LAYERS_TEST.modules(root)
    known_modules = set(mods) | LAYERS_TEST.extensions()
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in mods.items()}
    strong, weak = defaultdict(set), defaultdict(set)
    for module, tree in trees.items():
        own, tagged = definitions(tree)
        for name in own:
            strong[name].add(module)
        for name in tagged:
            weak[name].add(module)
    found = []
    for module, tree in trees.items():
        rel = str(mods[module].relative_to(root))
        for line, name, code in accesses(module, mods[module], tree, known_modules):
            owners = strong.get(name) or weak.get(name) or set()
            if owners and module not in owners:
                found.append((rel, line, name, code, sorted(owners)))
    return sorted(found)


def test_no_module_touches_another_modules_private_names():
    problems = [f"{rel}:{line}: {code} ({name} belongs to {', '.join(owners)})"
                for rel, line, name, code, owners in crossings() if (rel, name) not in KNOWN]
    assert not problems, (
        "a module reaches another module's underscore names; use the internal interface "
        "(docs/architecture.md, 'Internal interface': commlib.lifecycle, the Runtime's documented fields) "
        "or give the name a public spelling in its own module:\n  " + "\n  ".join(problems))


def test_the_allow_list_is_current():
    """An entry of KNOWN that no longer matches is work that landed: delete the entry."""
    seen = {(rel, name) for rel, _, name, _, _ in crossings()}
    stale = sorted(f"{rel}: {name} ({owner})" for (rel, name), owner in KNOWN.items() if (rel, name) not in seen)
    assert not stale, "KNOWN lists accesses that are gone; delete these entries:\n  " + "\n  ".join(stale)


def test_the_check_sees_crossings(tmp_path):
    """The check fails on each kind of access, and passes a module's own names and a framework's."""
    pkg = tmp_path / PACKAGE
    (pkg / "plug").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "api.py").write_text("_state = None\n\ndef _rt():\n    return _state\n")
    (pkg / "sets.py").write_text("class Table:\n    def __init__(self):\n        self._sets = {}\n")
    (pkg / "state.py").write_text("class State:\n    __slots__ = ('_bcast',)\n\n"
                                  "    def same(self, other):\n        return other._bcast\n")
    (pkg / "plug" / "__init__.py").write_text("")
    (pkg / "plug" / "use.py").write_text(
        "import os\n"
        "from .. import api, _kernels\n"               # a compiled extension is a module: fine
        "from ..api import _rt\n"                      # 1: another module's private function
        "def f(tape, state):\n"
        "    api._rt().x = 1\n"                         # 2: through the module
        "    n = _rt()._sets\n"                         # 3: another module's attribute
        "    b = getattr(state, '_bcast')\n"            # 4: by string
        "    tape._persistent = True\n"                 # a framework's private name: not judged
        "    os._exit(0)\n")                            # the standard library's: not judged
    found = crossings(tmp_path)
    assert [(rel, name) for rel, _, name, _, _ in found] == [
        ("commlib/plug/use.py", "_rt"), ("commlib/plug/use.py", "_rt"), ("commlib/plug/use.py", "_sets"),
        ("commlib/plug/use.py", "_bcast")], found
