"""The documentation holds together: every relative link in README.md and docs/ resolves (file and heading),
every docs/results/ file the text names exists, and no file of the tree narrates how it was written."""

import glob
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the word check reads: the package, its docs, scripts, tests, examples, C sources and build files.
SCANNED = ("README.md", "setup.py", "MANIFEST.in", "docs", "commlib", "scripts", "tests", "examples", "csrc",
           ".ci")
SKIP_DIRS = {"__pycache__", ".venv", "build", "dist", ".git", ".whl"}
WORD = "ses" + "sion"      # spelled in two pieces so that this file does not match itself
# The word is checked in prose only: Markdown outside code, and comments, docstrings and messages in code.
# Code spans (`x`, ``x``), identifiers (`tf.compat.v1.Session`, `SessionRunHook`, `start_new_...`) and
# one-word string literals (pytest's scope) are API names, not narrative.
CODE_SPAN = re.compile(r"``.*?``|`[^`]*`")
PROSE_TOKENS = {tokenize.COMMENT, tokenize.STRING} | (
    {tokenize.FSTRING_MIDDLE} if hasattr(tokenize, "FSTRING_MIDDLE") else set())

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
RESULTS_MENTION = re.compile(r"docs/results/([A-Za-z0-9_.*{},-]*[A-Za-z0-9_*}])")


def markdown_files(root: Path = REPO) -> list:
    return sorted([root / "README.md", *(root / "docs").rglob("*.md")])


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]{2,}|`", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def anchors(path: Path) -> set:
    found, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def broken_links(path: Path) -> list:
    """'file:line: target (why)' for every relative link of a markdown file that does not resolve."""
    broken = []
    text = path.read_text(encoding="utf-8")
    text_no_code = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for number, line in enumerate(text_no_code.splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):      # http:, https:, mailto: ...
                continue
            file_part, _, fragment = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{_shown(path)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{where} (no heading '#{fragment}' in {dest.name})")
    return broken


def expand_braces(pattern: str) -> list:
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [p for choice in match.group(1).split(",")
            for p in expand_braces(pattern[:match.start()] + choice + pattern[match.end():])]


def missing_results(path: Path, root: Path = REPO) -> list:
    """Names under docs/results/ that the text mentions and that match no file."""
    missing = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for name in RESULTS_MENTION.findall(line):
            for candidate in expand_braces(name):
                if not glob.glob(str(root / "docs" / "results" / candidate)):
                    missing.append(f"{_shown(path)}:{number}: docs/results/{candidate}")
    return missing


def text_files(root: Path = REPO):
    for entry in SCANNED:
        start = root / entry
        paths = [start] if start.is_file() else sorted(start.rglob("*")) if start.is_dir() else []
        for path in paths:
            if path.is_file() and not SKIP_DIRS.intersection(path.relative_to(root).parts):
                try:
                    yield path, path.read_text(encoding="utf-8")
                except UnicodeDecodeError:
                    continue                                  # images, compiled extensions


def _prose(path: Path, text: str):
    """(line number, prose) pairs of a file: what a reader reads as sentences."""
    if path.suffix == ".py":
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        except (tokenize.TokenError, SyntaxError):
            tokens = None
        if tokens is not None:
            for token in tokens:
                prose = token.type == tokenize.COMMENT or re.search(r"\s", token.string)
                if token.type in PROSE_TOKENS and prose:
                    for offset, line in enumerate(token.string.splitlines()):
                        yield token.start[0] + offset, line
            return
    if path.suffix == ".md":
        text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    yield from enumerate(text.splitlines(), 1)


def narrative_words(root: Path = REPO) -> list:
    hits = []
    for path, text in text_files(root):
        for number, line in _prose(path, text):
            if WORD in CODE_SPAN.sub("", line).lower():
                hits.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]}")
    return hits


def test_every_relative_link_resolves():
    broken = [b for path in markdown_files() for b in broken_links(path)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def unindexed_pages(root: Path = REPO) -> list:
    """docs/*.md pages that README.md's Documentation list does not link."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    index = readme.split("## Documentation", 1)[-1].split("\n## ", 1)[0]
    linked = set(LINK.findall(index))
    return [f"docs/{p.name}" for p in sorted((root / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]


def test_readme_indexes_every_docs_page():
    missing = unindexed_pages()
    assert not missing, "add these to README.md's Documentation list:\n" + "\n".join(missing)


def test_every_named_results_file_exists():
    missing = [m for path in markdown_files() for m in missing_results(path)]
    assert not missing, "named in the docs but not in docs/results/:\n" + "\n".join(missing)


def test_no_file_narrates_its_writing():
    hits = narrative_words()
    assert not hits, f"the word '{WORD}' (write what the code does, not how it was written):\n" + "\n".join(hits)


def test_the_checks_catch_what_they_look_for(tmp_path):
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "kept.txt").write_text("x")
    (tmp_path / "docs" / "other.md").write_text("# Other page\n\n## A `code` heading's part\n")
    (tmp_path / "README.md").write_text(
        "## Documentation\n\n- [other](docs/other.md)\n\n## Layout\n\n"
        "[ok](docs/other.md) [ok](docs/other.md#a-code-headings-part) [web](https://example.org/x)\n"
        "[gone](docs/missing.md) [bad anchor](docs/other.md#nowhere)\n"
        "```\n[in code](not/checked.md)\n```\n"
        "docs/results/kept.txt docs/results/{kept,lost}.txt docs/results/gone_*.json\n")
    (tmp_path / "commlib").mkdir()
    (tmp_path / "commlib" / "x.py").write_text(
        f"subprocess.Popen(a, start_new_{WORD}=True)\n# written in the last {WORD.upper()}\n"
        f"{WORD} = tf.compat.v1.{WORD.title()}()\n@fixture(scope='{WORD}')\n"
        f'def f():\n    """Uses ``{WORD.title()}RunHook``; a {WORD} later."""\n')
    (tmp_path / "docs" / "tf.md").write_text(
        f"Pass `{WORD}` to `after_create_{WORD}`.\n```\n{WORD}.run()\n```\nThe last {WORD} wrote this.\n")
    links = broken_links(tmp_path / "README.md")
    assert [b.split(": ", 1)[1] for b in links] == [
        "docs/missing.md (no such file)", "docs/other.md#nowhere (no heading '#nowhere' in other.md)"]
    assert unindexed_pages(tmp_path) == ["docs/tf.md"]
    assert [m.split(": ", 1)[1] for m in missing_results(tmp_path / "README.md", tmp_path)] == [
        "docs/results/lost.txt", "docs/results/gone_*.json"]
    assert [h.split(":")[0:2] for h in narrative_words(tmp_path)] == [
        ["docs/tf.md", "5"], ["commlib/x.py", "2"], ["commlib/x.py", "6"]]
