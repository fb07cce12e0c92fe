"""The documentation: the generated references are current, and every relative link resolves in the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import gen_docs

REPO = Path(__file__).resolve().parent.parent
# Every Markdown page of the repository, committed or not yet (ignored files aside: .pytest_cache's README).
_LISTED = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
    cwd=REPO,
    capture_output=True,
    text=True,
    check=True,
    timeout=30,
)
PAGES = sorted(REPO / name for name in _LISTED.stdout.splitlines() if (REPO / name).is_file())
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


@pytest.mark.parametrize("page", list(gen_docs.pages()), ids=lambda p: p.name)
def test_generated_page_is_current(page: Path) -> None:
    """docs/commands.md and docs/configuration.md say what the parsers and the model say now."""
    if page == gen_docs.COMMANDS_PAGE and sys.version_info[:2] != gen_docs.HELP_PYTHON:
        pytest.skip(f"the commands page is argparse's help on Python {gen_docs.HELP_PYTHON}, laid out otherwise here")
    current = gen_docs.pages()[page]
    written = page.read_text() if page.is_file() else None
    assert written == current, f"{page.relative_to(REPO)} is stale: run `{gen_docs.REGENERATE}` and commit it"


def links(text: str) -> list[str]:
    """The link targets of Markdown text, outside its code blocks."""
    return LINK.findall(re.sub(r"```.*?```", "", text, flags=re.DOTALL))


def anchors(page: Path) -> set[str]:
    return {gen_docs.anchor(heading) for heading in HEADING.findall(page.read_text())}


def broken_links(page: Path, text: str) -> list[str]:
    """Each link of `text` (the content of `page`) that is neither a public web address (http, https) nor a file of
    the repository (and one of its headings, if it names one): a `file:` link or a path out of the repository
    resolves on one machine only."""
    broken = []
    for target in links(text):
        if re.match(r"https?://", target):
            continue
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            broken.append(f"{target} (not a web address)")
            continue
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(REPO) or not resolved.exists():
            broken.append(f"{target} (no such file in the repository)")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    """Each link of the page is a web address or a file of the repository (and its heading, if it names one)."""
    broken = broken_links(page, page.read_text())
    assert not broken, f"{page.relative_to(REPO)}: broken links: {', '.join(broken)}"


def test_link_check_finds_broken_links() -> None:
    """The check refuses a link out of the repository (README's old ../shared/DESIGN.md), a missing file, a missing
    heading and a file: address, and takes a good one and a web address."""
    text = (
        "[a](../shared/DESIGN.md) [b](docs/nothing.md) [c](docs/index.md#no-such-heading) [d](docs/index.md)"
        " [e](file:///usr/share/doc/fedload/README.md) [f](https://docs.astral.sh/uv/)"
    )
    assert [b.split()[0] for b in broken_links(REPO / "README.md", text)] == [
        "../shared/DESIGN.md",
        "docs/nothing.md",
        "docs/index.md#no-such-heading",
        "file:///usr/share/doc/fedload/README.md",
    ]


def unlisted_pages(index: Path, pages: list[Path]) -> list[str]:
    """The pages of `pages` that `index` does not link to."""
    linked = {(index.parent / target.partition("#")[0]).resolve() for target in links(index.read_text())}
    return [str(page.relative_to(REPO)) for page in pages if page != index and page.resolve() not in linked]


def test_the_index_lists_every_page() -> None:
    """docs/index.md links every page of docs/ and every README, the CHANGELOG: the house has a plan."""
    assert unlisted_pages(REPO / "docs" / "index.md", [p for p in PAGES if p != REPO / "README.md"]) == []
    assert unlisted_pages(REPO / "docs" / "index.md", [*PAGES, REPO / "docs" / "nowhere.md"])[-1] == "docs/nowhere.md"


def unnamed_modules(architecture: str, modules: list[Path]) -> list[str]:
    """The modules of `modules` whose file name the architecture page does not name (as `name.py`)."""
    return [str(m.relative_to(REPO)) for m in modules if f"`{m.name}`" not in architecture]


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md says in a sentence what each module of fedload/ is for: a new module gets its line."""
    modules = sorted(p for p in (REPO / "fedload").rglob("*.py") if p.name != "__init__.py")
    architecture = (REPO / "docs" / "architecture.md").read_text()
    assert unnamed_modules(architecture, modules) == []
    assert unnamed_modules(architecture, [REPO / "fedload" / "nowhere.py"]) == ["fedload/nowhere.py"]


def test_every_bench_script_has_its_row() -> None:
    """bench/README.md's table has a row for every script of bench/ (common.py is their library)."""
    readme = (REPO / "bench" / "README.md").read_text()
    scripts = sorted(p.name for p in (REPO / "bench").glob("*.py") if p.name != "common.py")
    assert [name for name in scripts if f"bench/{name}" not in readme] == []
