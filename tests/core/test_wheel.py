"""The package as a new user gets it: build the wheel, install it with the ``mpich`` extra into a fresh
venv, import every module and run a 2-rank allreduce from a folder outside the source tree.

Needs pip to reach PyPI (or pip's cache) for the dependencies; skips, saying so, only where it cannot.
The torch plug-in's modules are imported only if torch is importable in the fresh venv (it is not
installed there: too large for a test); that they are in the wheel is checked all the same. A framework
plug-in imported without its framework must raise an ImportError that says what to install.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from mpirun import REPO, require_marker

pytestmark = pytest.mark.mpi

IMPORT_ALL = """
import importlib, importlib.util, pkgutil, sys
import commlib
assert not commlib.__file__.startswith(sys.argv[1]), f"imported from the source tree: {commlib.__file__}"
# a framework plug-in imports its framework (commlib.ray: Ray): without it installed, its modules are not imported
plugins = {"commlib.torch": "torch", "commlib.jax": "jax", "commlib.tensorflow": "tensorflow", "commlib.keras": "keras",
           "commlib.ray": "ray"}
absent = {p for p, framework in plugins.items() if importlib.util.find_spec(framework) is None}
imported, skipped = [], []
for info in pkgutil.walk_packages(commlib.__path__, "commlib."):
    if info.name.endswith(".__main__"):
        continue  # importing it would run the command (commlib.bench's CLI)
    if any(info.name == p or info.name.startswith(p + ".") for p in absent):
        if info.name in absent:  # the plug-in itself says what to install
            try:
                importlib.import_module(info.name)
            except ImportError as exc:
                assert f"pip install 'commlib[" in str(exc), f"{info.name}: {exc}"
            else:
                raise AssertionError(f"{info.name} imported without {plugins[info.name]}")
        skipped.append(info.name)
        continue
    importlib.import_module(info.name)
    imported.append(info.name)
print(f"imported {len(imported)} modules from {commlib.__path__[0]}; frameworks absent, not imported: {skipped}")
"""

ALLREDUCE = """
import numpy as np
import commlib as cl
cl.init()
got = cl.allreduce(np.arange(5, dtype=np.float32) + cl.rank(), op=cl.Sum, name="x")
assert np.array_equal(got, 2 * np.arange(5) + 1), got
print(f"rank {cl.rank()} of {cl.size()}: allreduce OK", flush=True)
cl.shutdown()
"""


def _run(cmd, cwd, timeout=600):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _source_modules() -> set[str]:
    """Every file of the package in the source tree, as its path inside a wheel (``commlib/...``)."""
    return {str(p.relative_to(REPO)) for p in (REPO / "commlib").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".so", ".pyc")}


def _ignored(folder: str, names: list[str]) -> set[str]:
    """What a clean checkout lacks: the venv, old builds, compiled files, caches."""
    top = {".git", ".venv", "build", "dist", ".pytest_cache"} if Path(folder) == REPO else set()
    return {n for n in names if n in top or n == "__pycache__" or n.endswith((".so", ".pyc", ".egg-info"))}


def _pip_install(python: Path, *requirements: str, cwd: Path) -> subprocess.Popen:
    """The outer pip installs into the fresh venv (no pip of its own to bootstrap), reusing pip's cache."""
    return subprocess.Popen([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                             "--only-binary", ":all:", *requirements], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(install: subprocess.Popen) -> None:
    try:
        text = install.communicate(timeout=600)[0]
    except subprocess.TimeoutExpired:
        install.kill()
        raise AssertionError(f"pip install did not finish within 600 s: {install.args}") from None
    if install.returncode != 0:
        if any(s in text for s in ("No matching distribution", "Could not find a version", "NewConnectionError",
                                   "Temporary failure in name resolution", "Network is unreachable")):
            pytest.skip(f"pip cannot fetch the dependencies (no network, nothing cached): {text[-500:]}")
        raise AssertionError(text)


def test_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # Only to save time: the dependencies download while the wheel builds. Installing the wheel with its
    # extra below resolves them from the wheel's own metadata all the same.
    prefetch = _pip_install(python, "numpy", "mpi4py", "ml_dtypes", "mpich", cwd=tmp_path)
    try:
        # Built from a clean copy: setuptools packs whatever an old build/ folder holds, which would hide
        # a module that find_packages misses.
        source = tmp_path / "source"
        shutil.copytree(REPO, source, ignore=_ignored)
        # Build isolation would fetch setuptools afresh (minutes on a slow index): this venv's will do.
        isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
        built = _run([sys.executable, "-m", "pip", "wheel", source, "--no-deps", *isolation, "-q",
                      "-w", tmp_path / "dist"], cwd=tmp_path)
    finally:
        _finish(prefetch)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next((tmp_path / "dist").glob("commlib-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = _source_modules() - names
    assert not missing, f"the wheel lacks {sorted(missing)}: a package folder without __init__.py?"
    assert any(n.startswith("commlib/_kernels") for n in names) and any(n.startswith("commlib/_peer_memory")
                                                                        for n in names), sorted(names)
    _finish(_pip_install(python, f"{wheel}[mpich]", cwd=tmp_path))

    outside = tmp_path / "elsewhere"  # neither the repository nor its parent on the import path
    outside.mkdir()
    imports = _run([python, "-c", IMPORT_ALL, str(REPO)], cwd=outside, timeout=300)
    assert imports.returncode == 0, imports.stdout + imports.stderr
    print(imports.stdout)

    require_marker("mpi")
    mpiexec = env_dir / "bin" / "mpiexec"
    assert mpiexec.exists(), "the mpich extra did not install an mpiexec into the venv"
    job = _run([mpiexec, "-n", "2", python, "-c", ALLREDUCE], cwd=outside, timeout=120)
    assert job.returncode == 0 and job.stdout.count("allreduce OK") == 2, job.stdout + job.stderr
