"""No module but commlib/config.py reads commlib's or Horovod's variables from the environment.

The rule, checked on the source of every module under commlib/ (an AST scan; nothing is imported):

- The environment is ``os.environ`` (also through ``import os as x`` or ``from os import environ``) and
  every name a module binds to it (``environ = os.environ if environ is None else environ``): such an
  alias is held to the same rule wherever the module uses the name. A copy (``dict(os.environ)``) is not
  an alias: making one outside ``env=`` is already a finding (below).
- A variable may be looked up by its name (``E[k]``, ``E.get(k)``, ``E.pop(k)``, ``E.setdefault(k)``,
  ``k in E``, ``os.getenv(k)``, a write ``E[k] = v``) only where ``k`` is a string literal that does not
  start with ``COMMLIB_`` or ``HOROVOD_``, or a loop variable that runs over such literals only (written
  out, or a module constant bound once to them, e.g. ``RANK_VARIABLES``). Any other
  key (a ``COMMLIB_*``/``HOROVOD_*`` name, a name built at run time, a variable) is a finding.
- The environment as a whole may be handed on only to a child process: as a call's ``env=`` argument,
  alone or inside ``dict(...)``/``{**...}`` there. Any other use (iterating it, ``.items()``, ``.copy()``,
  ``.update()``, passing it to a function) is a finding: what receives it could read anything.
- A finding is allowed only where ALLOWED names the module and function, with the reason. A new one
  fails this test until someone reads it and either moves the read into commlib/config.py or adds it.

Not covered: the environment reached through ``getattr``/``importlib``/``ctypes`` (no module does that).
A second check: outside config.py no string literal is exactly a ``COMMLIB_*`` setting's variable name
(the launcher takes the names from config.FIELDS through ``config.environment``, not a copy).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "commlib"
CONFIG = PACKAGE / "config.py"
PREFIXES = ("COMMLIB_", "HOROVOD_")
KEY_METHODS = {"get", "pop", "setdefault", "__getitem__", "__contains__", "__delitem__"}

#: (module path under commlib/, enclosing function) -> why it may touch the environment as it does
ALLOWED = {
    ("run/mpi.py", "forwarded"): "lists the names of the caller's variables Open MPI must pass on to the ranks "
                                 "(hydra passes them all); reads no value",
    ("ray/standin.py", "main"): "the rank hydra starts on Ray hands the variables hydra gave it (PMI_*, the job's "
                                "-genv settings, by prefix: member.HANDED) to the actor that becomes this rank, as "
                                "a launcher passes its environment to a child; interprets no value",
    ("ray/member.py", "join"): "the actor takes the rank's variables from its stand-in (above) into its own "
                               "environment before MPI_Init; init() reads them through config.py",
    ("ray/member.py", "update_env"): "RayExecutor's extra_env_vars (Horovod's API) and each worker's "
                                     "CUDA_VISIBLE_DEVICES set in the actor's process; interprets no value",
    ("torch/util.py", "env"): "Horovod's test helper horovod.common.util.env: sets the variables its caller "
                              "names for a block and puts back what was there; interprets no value (init() "
                              "reads them through config.py)",
    ("torch/distributed/rendezvous.py", "handler"): "torch's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, "
                                                    "MASTER_PORT): whether torch's own handler can run; reads "
                                                    "no COMMLIB_*/HOROVOD_* value",
    ("torch/distributed/pmi.py", "start"): "sets PMI_FD/PMI_RANK/PMI_SIZE for MPI_Init in a process torchrun "
                                           "started (the backend's PMI bridge); reads no value",
}


class _Scan(ast.NodeVisitor):
    """Findings of one module: (line, function, what)."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.os_names = {"os"}
        self.environ_names: set[str] = set()
        self.getenv_names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.os_names |= {a.asname or a.name for a in node.names if a.name == "os"}
            elif isinstance(node, ast.ImportFrom) and node.module == "os":
                for a in node.names:
                    if a.name == "environ":
                        self.environ_names.add(a.asname or a.name)
                    elif a.name in ("getenv", "putenv", "unsetenv"):
                        self.getenv_names.add(a.asname or a.name)
        self.aliases = self._aliases()
        self.findings: list[tuple[int, str, str]] = []

    # -- what the environment is -------------------------------------------------------------------------
    def is_environ(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute) and node.attr == "environ":
            return isinstance(node.value, ast.Name) and node.value.id in self.os_names
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            return node.id in self.environ_names or node.id in getattr(self, "aliases", ())
        return False

    def _flows(self, value: ast.AST, aliases: set[str]) -> bool:
        """Whether the environment itself is what ``value`` gives (not something computed from it)."""
        if isinstance(value, ast.IfExp):
            return self._flows(value.body, aliases) or self._flows(value.orelse, aliases)
        if isinstance(value, ast.BoolOp):
            return any(self._flows(v, aliases) for v in value.values)
        if isinstance(value, ast.Attribute) and value.attr == "environ":
            return isinstance(value.value, ast.Name) and value.value.id in self.os_names
        return isinstance(value, ast.Name) and (value.id in self.environ_names or value.id in aliases)

    def _aliases(self) -> set[str]:
        aliases: set[str] = set()
        while True:
            found = set(aliases)
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None \
                        and self._flows(node.value, aliases):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    found |= {t.id for t in targets if isinstance(t, ast.Name)}
            if found == aliases:
                return aliases
            aliases = found

    def _literal_names(self, node: ast.AST) -> list[str] | None:
        """The strings of a tuple or list of string literals, or of a module constant bound once to one."""
        if isinstance(node, ast.Name):
            bound = [n for n in self.tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                     and any(isinstance(t, ast.Name) and t.id == node.id
                             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
            stores = [n for n in ast.walk(self.tree) if isinstance(n, ast.Name) and n.id == node.id
                      and isinstance(n.ctx, ast.Store)]
            if len(bound) != 1 or len(stores) != 1:
                return None
            node = bound[0].value
        if isinstance(node, (ast.Tuple, ast.List)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            return [e.value for e in node.elts]
        return None

    # -- the checks --------------------------------------------------------------------------------------
    def function_of(self, node: ast.AST) -> str:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node.name
        return "<module>"

    def key_ok(self, key: ast.AST | None, at: ast.AST) -> bool:
        """A literal name of neither commlib's nor Horovod's, or a loop variable over such literals only."""
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return not key.value.startswith(PREFIXES)
        if isinstance(key, ast.Name):
            scope = at
            while scope in self.parents and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = self.parents[scope]
            binders = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == key.id
                       and isinstance(n.ctx, ast.Store)]
            loops = [n for n in ast.walk(scope) if isinstance(n, (ast.For, ast.comprehension))
                     and isinstance(n.target, ast.Name) and n.target.id == key.id]
            if binders and len(binders) == len(loops):
                names = [self._literal_names(loop.iter) for loop in loops]
                return all(n is not None and not any(v.startswith(PREFIXES) for v in n) for n in names)
        return False

    def handed_to_a_child(self, node: ast.AST) -> bool:
        """``node`` is (inside dict(...) or {**...}) the value of a call's ``env=`` argument."""
        def is_dict_call(n):
            return isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "dict"

        while True:
            parent = self.parents.get(node)
            if isinstance(parent, ast.keyword):
                if parent.arg == "env":
                    return True
                if parent.arg is None and is_dict_call(self.parents[parent]):  # dict(**E)
                    node = self.parents[parent]
                    continue
                return False
            if is_dict_call(parent) and node in parent.args:  # dict(E, ...)
                node = parent
                continue
            if isinstance(parent, ast.Dict) and any(v is node and k is None for k, v in zip(parent.keys, parent.values)):
                node = parent  # {**E, ...}
                continue
            return False

    def becomes_an_alias(self, node: ast.AST) -> bool:
        while True:
            parent = self.parents.get(node)
            if isinstance(parent, (ast.IfExp, ast.BoolOp)):
                node = parent
                continue
            return isinstance(parent, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and parent.value is node

    def find(self, node: ast.AST, what: str) -> None:
        self.findings.append((node.lineno, self.function_of(node), what))

    def check(self) -> list[tuple[int, str, str]]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                is_getenv = (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                             and node.func.value.id in self.os_names and name in ("getenv", "putenv", "unsetenv")
                             ) or (isinstance(node.func, ast.Name) and name in self.getenv_names)
                if is_getenv and not self.key_ok(node.args[0] if node.args else None, node):
                    self.find(node, f"{name}({ast.unparse(node.args[0]) if node.args else ''})")
            if not self.is_environ(node):
                continue
            parent = self.parents.get(node)
            if isinstance(parent, ast.Subscript) and parent.value is node:
                if not self.key_ok(parent.slice, node):
                    self.find(node, f"environ[{ast.unparse(parent.slice)}]")
            elif isinstance(parent, ast.Attribute) and isinstance(self.parents.get(parent), ast.Call) \
                    and self.parents[parent].func is parent:
                call = self.parents[parent]
                if parent.attr not in KEY_METHODS:
                    self.find(node, f"environ.{parent.attr}(...)")
                elif not self.key_ok(call.args[0] if call.args else None, node):
                    self.find(node, f"environ.{parent.attr}({ast.unparse(call.args[0]) if call.args else ''})")
            elif isinstance(parent, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot)) for op in parent.ops):
                continue  # environ is None: no variable read
            elif isinstance(parent, ast.Compare) and node in parent.comparators:
                if not all(isinstance(op, (ast.In, ast.NotIn)) for op in parent.ops) \
                        or not self.key_ok(parent.left, node):
                    self.find(node, f"{ast.unparse(parent)}")
            elif self.becomes_an_alias(node) or self.handed_to_a_child(node):
                continue
            else:
                self.find(node, f"the environment used whole: {ast.unparse(parent)[:80]}")
        return self.findings


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != CONFIG:
            yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), filename=str(path))


def scan(source: str) -> list[tuple[int, str, str]]:
    """The findings of one module's source (for the rule's own tests)."""
    return _Scan(ast.parse(source)).check()


def test_no_module_but_config_reads_commlib_or_horovod_variables():
    findings = []
    for name, tree in _modules():
        for line, function, what in _Scan(tree).check():
            if (name, function) not in ALLOWED:
                findings.append(f"commlib/{name}:{line} in {function}(): {what}")
    assert not findings, ("the environment read outside commlib/config.py (parse the setting there, or add the "
                          "place with its reason to ALLOWED):\n" + "\n".join(findings))


def test_every_allowed_place_still_exists():
    """An exception nobody needs any more is removed from ALLOWED."""
    used = set()
    for name, tree in _modules():
        used |= {(name, function) for _, function, _ in _Scan(tree).check()}
    assert set(ALLOWED) <= used, f"ALLOWED names places that no longer touch the environment: {set(ALLOWED) - used}"


def test_the_rule_catches_what_it_should():
    bad = [
        'import os\nx = os.environ["COMMLIB_TIMEOUT"]',
        'import os\nx = os.environ.get("HOROVOD_FUSION_THRESHOLD", "1")',
        'import os\nx = os.getenv("COMMLIB_X")',
        'from os import environ\nx = "COMMLIB_X" in environ',
        'import os\nname = "X"\nx = os.environ.get("COMMLIB_" + name)',
        'import os\ndef f(k):\n    return os.environ[k]',
        'import os as o\nx = o.environ.get(f"HOROVOD_{1}")',
        'import os\nfor k, v in os.environ.items():\n    pass',
        'import os\nx = [k for k in os.environ]',
        'import os\nfrom .config import Config\nConfig.load(dict(os.environ))',
        'import os\ndef f(environ=None):\n    environ = os.environ if environ is None else environ\n'
        '    return environ["COMMLIB_ALGORITHM"]',
        'import os\ne = dict(os.environ)\nx = e["COMMLIB_TIMEOUT"]',
        'import os\nos.environ["COMMLIB_TIMEOUT"] = "1"',
        'import os\nfor v in ("PMI_RANK", "COMMLIB_X"):\n    os.environ.get(v)',
        'import os\nNAMES = ("PMI_RANK", "COMMLIB_X")\nx = [os.environ[v] for v in NAMES]',
        'import os\nNAMES = ["PMI_RANK"]\nNAMES.append("COMMLIB_X")\nNAMES = NAMES\nx = [os.environ[v] for v in NAMES]',
    ]
    for source in bad:
        assert scan(source), f"not caught:\n{source}"
    good = [
        'import os\nx = os.environ.get("XDG_CACHE_HOME")',
        'import os\nx = os.environ["PATH"]',
        'import os, subprocess\nsubprocess.run(["true"], env=dict(os.environ, A="1"))',
        'import os, subprocess\nsubprocess.run(["true"], env={**os.environ, "A": "1"})',
        'import os\nfor v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):\n    os.environ.get(v)',
        'import os\nRANKS = ("PMI_RANK", "PMIX_RANK")\nx = [os.environ[v] for v in RANKS if v in os.environ]',
        'import os\ndef f(environ=None):\n    environ = os.environ if environ is None else environ\n'
        '    return environ.get("XDG_CACHE_HOME")',
        'x = "the variable COMMLIB_TIMEOUT (a message)"',
    ]
    for source in good:
        assert not scan(source), f"wrongly caught:\n{source}\n{scan(source)}"


def test_no_copy_of_a_setting_variable_name():
    from commlib.config import FIELDS

    names = {field.env for field in FIELDS.values()}
    copies = []
    for name, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names:
                copies.append(f"commlib/{name}:{node.lineno}: {node.value!r}")
    assert not copies, ("a setting's variable name spelt outside commlib/config.py (use config.FIELDS[...].env or "
                        "config.environment()):\n" + "\n".join(copies))
