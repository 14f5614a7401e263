"""docs/architecture.md agrees with the layer table (LAYERS in tests/core/test_layers.py, the one the import check
enforces): the same layers in the same order with the same modules, and a tree that names every top-level
module and package of commlib."""

from __future__ import annotations

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def layer_table():
    """LAYERS, read from the layer test wherever the test tree keeps it."""
    (path,) = [p for p in ROOT.glob("tests/**/test_layers.py")]
    spec = importlib.util.spec_from_file_location("layers_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LAYERS


def module_name(token: str) -> str:
    """A name as the doc writes it (`errors`, `transport/`, `coordinator.requests`, `commlib/__init__.py`)
    as LAYERS does (commlib.errors, commlib.transport, ...)."""
    if token == "commlib/__init__.py":
        return "commlib"
    return "commlib." + token.rstrip("/").replace("/", ".")


def doc_layers(text: str) -> list[tuple[str, set[str]]]:
    rows = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("| layer"):
            in_table = True
            continue
        if in_table and line.startswith("|---"):
            continue
        if in_table and line.startswith("|"):
            layer, modules = [cell.strip() for cell in line.strip().strip("|").split("|", 1)]
            rows.append((layer.strip("` "), {module_name(t) for t in re.findall(r"`([^`]+)`", modules)}))
        elif in_table:
            break
    return rows


def doc_tree(text: str) -> str:
    match = re.search(r"The tree:\n\n```\n(.*?)```", text, re.S)
    assert match, "docs/architecture.md has no tree (a code block after 'The tree:')"
    return match.group(1)


def test_the_doc_table_is_the_layer_table():
    expected = [(name, set(modules)) for name, modules in layer_table()]
    got = doc_layers(DOC.read_text())
    assert [name for name, _ in got] == [name for name, _ in expected], "the layers or their order differ"
    for (name, mods), (_, want) in zip(got, expected):
        assert mods == want, f"layer {name}: the doc names {sorted(mods)}, LAYERS {sorted(want)}"


def test_the_tree_names_every_top_level_module_and_package():
    tree = doc_tree(DOC.read_text())
    named = set(re.findall(r"[\w.]+\.py|\w+/", tree))
    package = ROOT / "commlib"
    present = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    present |= {p.name + "/" for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(present - named)
    assert not missing, f"docs/architecture.md's tree does not show {missing}"


def test_the_checks_read_a_table(tmp_path):
    text = ("| layer (lowest first) | modules |\n|---|---|\n| base | `errors`, the C extensions `_kernels` |\n"
            "| services | `server/`, `geo` |\n| package | `commlib/__init__.py` (re-exports only) |\n\nafter\n")
    assert doc_layers(text) == [("base", {"commlib.errors", "commlib._kernels"}),
                                ("services", {"commlib.server", "commlib.geo"}), ("package", {"commlib"})]
