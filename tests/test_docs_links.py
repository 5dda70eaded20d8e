"""Every relative link in the README and the docs resolves to a file or directory of the
repository, and so does every `bench/results/...` path the docs name in code spans (the
results are pruned and gzipped: a renamed or dropped run must not leave a doc pointing at it).
No network: web links are not followed."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", REPO / "bench/README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
# [text](target) and ![alt](target), with an optional "title"; the text may span lines.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
RESULTS_PATH = re.compile(r"`(bench/results/[^`\s{}*<>]*)`")


def targets(doc):
    """(line, target) of every link in `doc` outside fenced code blocks."""
    text = doc.read_text(encoding="utf-8")
    # Blank the fenced blocks (keeping their newlines, so line numbers stay right).
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for pattern in (LINK, REFERENCE):
        for m in pattern.finditer(text):
            yield text.count("\n", 0, m.start()) + 1, m.group(1)


def is_local(target):
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) and not target.startswith(("#", "//"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_relative_links_resolve(doc):
    dangling = []
    for line, target in targets(doc):
        if not is_local(target):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not path:
            continue
        resolved = (REPO / path.lstrip("/")) if path.startswith("/") else (doc.parent / path)
        if not resolved.exists():
            dangling.append(f"{doc.relative_to(REPO)}:{line}: {target}")
    assert not dangling, "dangling links:\n" + "\n".join(dangling)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(REPO)))
def test_named_results_exist(doc):
    text = doc.read_text(encoding="utf-8")
    missing = [f"{doc.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)}"
               for m in RESULTS_PATH.finditer(text) if not (REPO / m.group(1)).exists()]
    assert not missing, "bench/results paths that do not exist:\n" + "\n".join(missing)


def test_the_checks_find_links():
    """The patterns still match the docs' links (a check that finds nothing passes vacuously)."""
    found = [t for doc in DOCS for _, t in targets(doc)]
    assert "../bench/results/cloudstone/sprout/search.html" in found
    assert "fleet.md#routing-measured-sprout-bench-fleet" in found
    assert len(found) > 50
