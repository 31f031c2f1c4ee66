"""Every relative link of the documentation (README.md, docs/, benchmarks/ and the package's READMEs) names a file
or folder of the repository: a moved or deleted file must take its links along. Links are checked against
``git ls-files`` where the checkout has git (a file only on the writer's disk is not in the repository), else
against the disk."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/*.md", "benchmarks/*.md", "benchmarks/results/**/README.md", "composer_qsdp/**/README.md",
        "tests/**/README.md"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def _tracked() -> set[str] | None:
    """Tracked files and every folder above one (paths relative to the root), or None without git."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    files = [f for f in out.split("\0") if f]
    return set(files) | {str(parent) for f in files for parent in Path(f).parents if str(parent) != "."}


def relative_links(text: str) -> list[str]:
    """The link targets of markdown ``text`` that point into the repository, without their ``#anchor``: links
    inside code are not links, and URLs and same-page anchors are not files."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_relative_links_are_parsed_outside_code_only() -> None:
    text = ("[a](docs/a.md#x) ![b](b.png) [c](https://x.org/c.md) [d](#top) `[e](e.md)`\n"
            "```\n[f](f.md)\n```\n[g](../g.md \"title\")\n")
    assert relative_links(text) == ["docs/a.md", "b.png", "../g.md"]


def test_every_relative_link_resolves_to_a_repository_file() -> None:
    tracked = _tracked()
    pages = sorted({page for pattern in DOCS for page in ROOT.glob(pattern)})
    assert ROOT / "README.md" in pages and len(pages) > 10
    broken = []
    for page in pages:
        if tracked is not None and str(page.relative_to(ROOT)) not in tracked:
            continue  # a page being written, not yet added
        for target in relative_links(page.read_text()):
            path = (page.parent / target).resolve()
            try:
                rel = str(path.relative_to(ROOT))
            except ValueError:
                broken.append(f"{page.relative_to(ROOT)}: {target} (outside the repository)")
                continue
            found = rel in tracked if tracked is not None else path.exists()
            if not found:
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to files that are not in the repository:\n" + "\n".join(broken)
