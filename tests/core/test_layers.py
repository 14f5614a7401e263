"""commlib's layers, and a check that the code obeys them (docs/architecture.md draws the same picture).

LAYERS below is the one table: lowest layer first. A module may import modules of its own layer and of
lower layers, never of a higher one, and no set of modules may import each other in a circle (whatever
their layers). Every import counts: at module level, inside functions, under ``if TYPE_CHECKING``.
What a lower layer needs from a higher one (a setting, the algorithm names, the collectives a compressor
uses) is handed to it as an argument or a registry that the higher layer fills, never imported.

An entry names a module, or a package with everything under it; the most specific entry wins. The entry
``commlib`` is the package's ``__init__`` only (the public re-exports). A new module that no entry
covers fails ``test_every_module_has_a_layer``: add it (or its package) to LAYERS, in the layer whose
modules it may use and that may use it.

Importing ``a.b.c`` also runs ``a/b/__init__.py``; that is Python's doing, not the module's, and is not
counted: what counts is what each file names.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

# ---- the layers: lowest first --------------------------------------------------------------------------
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # what everything speaks: errors, reduce ops, the dtype table, request/handle types, small containers,
    # and the compiled kernels (C extensions built by setup.py)
    ("base", ("commlib.errors", "commlib.ops", "commlib.dtypes", "commlib.cache", "commlib.buffers",
              "commlib.coordinator.requests",
              "commlib._kernels", "commlib._peer_memory", "commlib._compression")),
    # every argument rule (handed what it checks against, e.g. the algorithm names)
    ("rules", ("commlib.validation",)),
    # kernels' Python face, where tensors live, node layout, the trace writer
    ("kernels", ("commlib.kernels", "commlib.device", "commlib.topology", "commlib.timeline")),
    # point-to-point and collective transports (MPI, control channel, peer memory, staging, NCCL)
    ("transport", ("commlib.transport",)),
    # wire codecs and lossy compressors (handed the collectives they use: compression.base.Exchange)
    ("compression", ("commlib.compression",)),
    # pure schedules over a Transport, their registry, the cost model and auto
    ("algorithms", ("commlib.algorithms",)),
    # every COMMLIB_* setting, parsed and checked (it knows the algorithm names from their registry; the
    # layers below are handed the settings object, never import it)
    ("config", ("commlib.config",)),
    # one execution lane
    ("engine", ("commlib.engine",)),
    # negotiation, fusion, lanes, stalls
    ("coordinator", ("commlib.coordinator",)),
    # the worker's side of the summation servers: finding them in the job, pushing partitions to them
    ("server-client", ("commlib.server.protocol", "commlib.server.mpi_messages", "commlib.server.tcp",
                       "commlib.server.discovery", "commlib.server.plane", "commlib.server.client",
                       "commlib.server.mpi_plane", "commlib.server.tcp_plane", "commlib.server.geo_client")),
    # the state object and its process sets
    ("runtime", ("commlib.process_sets", "commlib.runtime")),
    # the one owner of the process's state: init, shutdown, the exit and abort paths, the rebuild over
    # survivors; and the internal interface services and plug-ins reach the runtime through
    ("lifecycle", ("commlib.lifecycle",)),
    # the public functions (they hand the compressors their collectives), and Adasum over them
    ("api", ("commlib.api", "commlib.adasum")),
    # the package's public face (re-exports only)
    ("package", ("commlib",)),
    # tools over the public API
    ("tools", ("commlib.bench", "commlib.testing")),
    # services above the core (the summation server's own loop and command line)
    ("services", ("commlib.server", "commlib.run", "commlib.elastic", "commlib.geo", "commlib.ray")),
    # what every framework plug-in shares
    ("frameworks", ("commlib.frameworks",)),
    # framework plug-ins: thin adapters, the top layer
    ("plug-ins", ("commlib.torch", "commlib.tensorflow", "commlib.keras", "commlib.jax")),
]
# -------------------------------------------------------------------------------------------------------

# Above the public API, services, the shared framework code and plug-ins reach the process's runtime only
# through the internal interface (commlib.lifecycle, and the Runtime's documented fields: docs/architecture.md,
# "Internal interface"), never by importing the runtime's parts. A layer listed here may not import these:
RUNTIME_INTERNALS = ("commlib.runtime", "commlib.process_sets", "commlib.engine", "commlib.coordinator")
#: ... except these, which are values and policies every layer may share
SHARED = ("commlib.coordinator.requests", "commlib.coordinator.backoff")
ON_THE_INTERFACE = ("services", "frameworks", "plug-ins")
# -------------------------------------------------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "commlib"
WHERE = "LAYERS at the top of tests/core/test_layers.py"


def modules(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def extensions() -> set[str]:
    """The compiled modules the layer table names (built from csrc/, no .py file)."""
    return {name for _, names in LAYERS for name in names if name.rpartition(".")[2].startswith("_")}


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the most specific entry covering ``module`` (None: no entry does)."""
    best, best_len = None, -1
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name or (name != PACKAGE and module.startswith(name + "."))
            if covers and len(name) > best_len:
                best, best_len = index, len(name)
    return best


def imports(module: str, path: pathlib.Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported commlib module, line) for every import statement in the file, wherever it stands. A
    ``from X import y`` names X.y when that is a module, else X (the names come from X's file)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found, seen = [], set()
    for node in sorted(ast.walk(tree), key=lambda n: getattr(n, "lineno", 0)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # X.y when that is a module; a private name (_y) not found as a .py file is taken for a compiled
            # extension, which must then be in LAYERS like any module
            targets = [f"{source}.{alias.name}"
                       if f"{source}.{alias.name}" in known or alias.name.startswith("_") else source
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target != PACKAGE and not target.startswith(PACKAGE + "."):
                continue
            while target not in known and layer_of(target) is None and "." in target:  # attributes drop
                target = target.rpartition(".")[0]
            if target != module and target not in seen:
                seen.add(target)
                found.append((target, node.lineno))
    return found


def graph(root: pathlib.Path = ROOT) -> tuple[dict[str, pathlib.Path], dict[str, list[tuple[str, int]]]]:
    mods = modules(root)
    known = set(mods) | extensions()
    return mods, {m: imports(m, p, known) for m, p in mods.items()}


def cycles(edges: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted({t for t, _ in edges.get(start, ())})))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted({t for t, _ in edges.get(child, ())}))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def unknown_modules(mods) -> list[str]:
    return sorted(m for m in mods if layer_of(m) is None)


def upward_imports(mods, edges) -> list[str]:
    problems = []
    for module, targets in sorted(edges.items()):
        own = layer_of(module)
        if own is None:
            continue
        for target, line in targets:
            theirs = layer_of(target)
            if theirs is None:
                problems.append(f"{mods[module].relative_to(ROOT)}:{line}: {module} imports {target}, which is "
                                f"in no layer; register it in {WHERE}")
            elif theirs > own:
                problems.append(f"{mods[module].relative_to(ROOT)}:{line}: {module} (layer {LAYERS[own][0]}) "
                                f"imports {target} (layer {LAYERS[theirs][0]}, higher)")
    return problems


def internal_imports(mods, edges) -> list[str]:
    """Imports of the runtime's parts by a module of a layer that must use the internal interface."""
    bound = {index for index, (layer, _) in enumerate(LAYERS) if layer in ON_THE_INTERFACE}
    problems = []
    for module, targets in sorted(edges.items()):
        if layer_of(module) not in bound:
            continue
        for target, line in targets:
            inside = any(target == name or target.startswith(name + ".") for name in RUNTIME_INTERNALS)
            shared = any(target == name or target.startswith(name + ".") for name in SHARED)
            if inside and not shared:
                problems.append(f"{mods[module].relative_to(ROOT)}:{line}: {module} imports {target}")
    return problems


def test_every_module_has_a_layer():
    mods, _ = graph()
    missing = unknown_modules(mods)
    assert not missing, (f"module(s) in no layer: {', '.join(missing)}; register each (or its package) in "
                         f"{WHERE}, in the layer it belongs to, and draw it in docs/architecture.md")


def test_imports_go_downward():
    mods, edges = graph()
    problems = upward_imports(mods, edges)
    assert not problems, ("a lower layer imports a higher one (hand it what it needs instead: an argument, "
                          "or a registry the higher layer fills):\n  " + "\n  ".join(problems))


def test_services_and_plug_ins_use_the_internal_interface():
    mods, edges = graph()
    problems = internal_imports(mods, edges)
    assert not problems, ("a service or plug-in imports a part of the runtime; reach it through "
                          "commlib.lifecycle (current(), config(), ...) and the Runtime's documented fields "
                          "(docs/architecture.md, 'Internal interface'):\n  " + "\n  ".join(problems))


def test_no_import_cycle():
    _, edges = graph()
    found = cycles(edges)
    detail = []
    for component in found:
        members = set(component)
        detail.append(", ".join(component) + "\n    " + "\n    ".join(
            f"{m} -> {t} (line {line})" for m in component for t, line in edges[m] if t in members))
    assert not found, "import cycle(s):\n  " + "\n  ".join(detail)


def test_the_checks_see_violations(tmp_path):
    """The checks above can fail: a package with an upward import, a circle and an unregistered module."""
    pkg = tmp_path / PACKAGE
    (pkg / "algorithms").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("def f():\n    from .config import x\n")  # base -> config: upward
    (pkg / "config.py").write_text("from .errors import y\n")  # and back: a circle
    (pkg / "algorithms" / "__init__.py").write_text("")
    (pkg / "algorithms" / "ring.py").write_text("from ..api import z\n")  # algorithms -> api: upward
    (pkg / "api.py").write_text("")
    (pkg / "nowhere.py").write_text("")
    (pkg / "runtime.py").write_text("")
    (pkg / "torch").mkdir()
    (pkg / "torch" / "__init__.py").write_text("from ..runtime import Runtime\nfrom .. import lifecycle\n")
    (pkg / "lifecycle.py").write_text("")
    mods = modules(tmp_path)
    known = set(mods) | extensions()
    edges = {m: imports(m, p, known) for m, p in mods.items()}
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = upward_imports(mods, edges)
    finally:
        ROOT = saved
    assert len(problems) == 2, problems
    assert any("commlib.errors (layer base) imports commlib.config (layer config" in p for p in problems)
    assert any("commlib.algorithms.ring (layer algorithms) imports commlib.api" in p for p in problems)
    assert cycles(edges) == [["commlib.config", "commlib.errors"]]
    saved, ROOT = ROOT, tmp_path
    try:
        assert internal_imports(mods, edges) == ["commlib/torch/__init__.py:1: commlib.torch imports commlib.runtime"]
    finally:
        ROOT = saved
    assert unknown_modules(mods) == ["commlib.nowhere"]


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
