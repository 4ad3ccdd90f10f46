"""The documentation stays whole: every link and anchor resolves, the README stays a front page that links to
every page of docs/, and each page opens with a title and a paragraph saying what it covers."""

import re
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
from helpers import markdown_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
CHECKED = [README, *PAGES, ROOT / "assets" / "fashion" / "README.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)]*)\)")
TITLE = re.compile(r"\s+\"[^\"]*\"$")
LINK_TEXT = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\([^)]*\)")


def prose_lines(text: str) -> list[str]:
    """The lines Markdown renders as prose: no YAML front matter, no fenced code (links and headings there are
    not links and headings)."""
    lines = text.splitlines()
    if lines and lines[0] == "---":  # a Space card's front matter
        lines = lines[lines.index("---", 1) + 1:]
    kept, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append(line)
    return kept


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text lower-cased, punctuation other than '-' and '_' removed
    (backticks included), each space made a '-'."""
    text = LINK_TEXT.sub(r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    """The targets of the inline links and images of ``path``, outside code."""
    paragraphs = "\n".join(prose_lines(path.read_text())).split("\n\n")  # links and code spans may wrap
    found = [target for paragraph in paragraphs for target in LINK.findall(CODE_SPAN.sub("", paragraph))]
    return [TITLE.sub("", target.strip()).strip("<>") for target in found]


def link_error(page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``page``, is broken; None when it resolves."""
    if target.startswith(("http://", "https://")):
        url = urlparse(target)
        return None if "." in url.netloc and " " not in target else f"malformed URL {target}"
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
        return f"unsupported scheme in {target}"
    path_part, _, anchor = target.partition("#")
    linked = (page.parent / path_part).resolve() if path_part else page
    if not linked.is_relative_to(ROOT) or not linked.exists():
        return f"{target}: no such file"
    if anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
        return f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}"
    return None


def broken_links(pages: list[Path]) -> list[str]:
    return [f"{page.relative_to(ROOT)}: {error}" for page in pages for target in links(page)
            if (error := link_error(page, target))]


def test_slugs_follow_github_s_rules():
    assert slug("Performance: what a round costs") == "performance-what-a-round-costs"
    assert slug("`G*` against LANTERN++'s heuristic residual") == "g-against-lanterns-heuristic-residual"
    assert slug("A -- B_c") == "a----b_c" and slug("What's new?") == "whats-new"
    assert slug("See [the card](x.md)") == "see-the-card"


def test_every_link_and_anchor_resolves():
    assert PAGES, "docs/ has no pages"
    assert sum(len(links(page)) for page in CHECKED) > 50  # the parser finds the links that are there
    assert broken_links(CHECKED) == []


def test_a_broken_link_or_anchor_is_caught(tmp_path, monkeypatch):
    """The checker fails on each kind of fault it exists for (a page outside the repository is checked as if
    it were inside, so that relative links resolve)."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Set up: `pip`\n\nText.\n")
    page = tmp_path / "README.md"
    good = "[a](docs/a.md) `x\ny` [b\nc](docs/a.md#set-up-pip) [c](#top) [d](https://example.org/x)\n```\n[e](nowhere.md)\n```\n"
    page.write_text("# Top\n\n" + good)
    assert broken_links([page]) == []
    for bad in ("[x](docs/b.md)", "[x\ny](docs/a.md#set-up)", "[x](#nowhere)", "[x](https://exa mple)",
                "![x](docs/missing.png)", "[x](../outside.md)", "[x](ftp://example.org)"):
        page.write_text("# Top\n\n" + good + bad + "\n")
        assert len(broken_links([page])) == 1, bad


def test_readme_is_a_front_page_that_links_to_every_docs_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move depth into docs/"
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(README)}
    assert [page.name for page in PAGES if page.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_each_docs_page_has_a_title_and_an_opening_paragraph(page):
    blocks = [block.strip() for block in page.read_text().split("\n\n") if block.strip()]
    assert blocks[0].startswith("# ") and "\n" not in blocks[0], "the first line is the page's title"
    assert not blocks[1].startswith(("#", "*", "|", "`", "!", "1.")) and len(blocks[1]) > 150, "an opening paragraph"


def test_the_readme_gpu_table_is_the_performance_page_s():
    """The README's GPU rows are the measured ones of docs/performance.md, cell for cell, and its last row is the
    paper's measured LlamaGen-XL speed-ups at the two `tau` the implied row uses (method spec section 6)."""
    header = "| part / AR step | LlamaGen-XL t2i shape"
    readme, measured = (markdown_table(path.read_text(), header) for path in (README, ROOT / "docs" / "performance.md"))
    assert readme[:-1] == measured and len(measured) == 5
    assert readme[-1][1] == "2.03x / 2.72x" and "2.42 / 3.34" in readme[-2][0]


def python_blocks(page: Path) -> list[str]:
    """The page's fenced ``python`` code blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.DOTALL | re.MULTILINE)


def test_the_library_pages_examples_run_as_written(tmp_path, monkeypatch):
    """Issue 42.18: docs/library.md's example saved ``bundle.image(...)`` as if it were a PIL image (it is an
    array): every Python block of the page runs, in order, in one namespace, and the picture it saves opens."""
    import torch
    from PIL import Image

    blocks = python_blocks(ROOT / "docs" / "library.md")
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    try:
        namespace: dict = {}
        for block in blocks:
            exec(compile(block, "docs/library.md", "exec"), namespace)  # noqa: S102 (the docs' own code)
    finally:
        torch.set_num_threads(threads)
    bundle, out = namespace["bundle"], namespace["out"]
    height, width, _ = bundle.image(out.tokens).shape
    assert Image.open(tmp_path / "image.png").size == (width, height)
    assert [len(o.tokens) for o in namespace["outs"]] == [bundle.config.image_tokens] * 4
    assert namespace["UniformRSD"](2.0).relaxed_target(torch.ones(3), 1).tolist() == [2.0] * 3
