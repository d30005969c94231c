"""The documents stand on their own and match the code they describe.

- No Markdown file of the repository links outside it (a relative link that leaves the clone, or into the
  workspace's ``shared/``), and every relative link reaches a file that exists, at a heading that exists.
- ``docs/architecture.md`` names exactly the layers and import contracts ``pyproject.toml`` declares (which
  ``lint-imports`` checks), in the same order, so the document cannot drift from what is enforced.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: import-linter (a test extra) brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SKIP_DIRS = {".venv", ".git", "build", "node_modules", ".pytest_cache", ".ruff_cache"}

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def markdown_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.md")
                  if not SKIP_DIRS & set(p.relative_to(ROOT).parts) and "egg-info" not in str(p))


def links(text: str) -> list[str]:
    """Link targets of a Markdown text, outside code blocks; a code span's link text is kept (GitHub renders
    ``[`x`](y)`` as a link), a link written inside a code span is not."""
    text = FENCE.sub("", text)
    found = INLINE_LINK.findall(text) + REFERENCE_DEF.findall(text)
    spans = "".join(CODE_SPAN.findall(text))
    return [t for t in found if f"]({t})" not in spans]


def slugs(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (lower case, punctuation dropped, spaces to
    hyphens, repeats numbered)."""
    seen: Counter[str] = Counter()
    out = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", plain.strip().lower()).replace(" ", "-")
        out.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return out


def test_the_readme_and_docs_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/architecture.md", "docs/runbooks.md"} <= names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_stay_inside_the_repository_and_resolve(path: Path) -> None:
    text = path.read_text()
    problems = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        if "shared/" in file_part or file_part.startswith("/"):
            problems.append(f"{target}: outside the repository")
            continue
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: leaves the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in slugs(resolved.read_text()):
            problems.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert not problems, f"{path.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_link_check_sees_what_it_must() -> None:
    text = ("[a](../outside/DESIGN.md) [`b`](docs/x.md#y) `[c](not/a/link.md)`\n[d]: <e.md>\n"
            "```\n[f](in/a/fence.md)\n```\n")
    assert links(text) == ["../outside/DESIGN.md", "docs/x.md#y", "e.md"]
    assert slugs("# Layers and import contracts\n## `make run` (x)\n## A\n## A\n") == {
        "layers-and-import-contracts", "make-run-x", "a", "a-1"}


# --- docs/architecture.md against pyproject.toml -------------------------------------------------------------


def declared_contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def architecture_section() -> str:
    text = ARCHITECTURE.read_text()
    start = text.index("## Layers and import contracts")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_architecture_names_the_layers_lint_imports_checks_in_order() -> None:
    (layers,) = [c["layers"] for c in declared_contracts() if c["type"] == "layers" and "containers" not in c]
    block = re.search(r"^```text\n(.*?)^```", architecture_section(), re.MULTILINE | re.DOTALL)
    assert block, "docs/architecture.md: no ```text block of layers under 'Layers and import contracts'"
    documented = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert documented == [" | ".join(part.strip() for part in layer.split("|")) for layer in layers]


def test_architecture_names_every_import_contract_and_no_other() -> None:
    rows = re.findall(r"^\| `([^`]+)` \|", architecture_section(), re.MULTILINE)
    assert sorted(rows) == sorted(c["name"] for c in declared_contracts())
