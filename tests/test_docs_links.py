"""The README and docs/ pages link to files that exist: a page moved or renamed breaks a link here first."""

from __future__ import annotations

import re

import pytest

from mate_cli.paths import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "BENCHMARKS.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_names_a_file_that_exists(page):
    text = page.read_text(encoding="utf-8")
    targets = [t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    local = [t for t in targets if t and not re.match(r"[a-z]+:", t)]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_the_readme_stays_short_and_links_each_docs_page():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for page in sorted((REPO_ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, page.name
