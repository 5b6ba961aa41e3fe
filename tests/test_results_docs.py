"""docs/results is organised by claim: each folder says how to re-make it, and every link in the docs lands.

A results folder whose README does not name its `reproduce.sh`, or whose script is missing, duplicated or does not
parse, is evidence nobody can regenerate; a relative Markdown link that points nowhere is a claim whose evidence
moved. Both are checked here on the CPU (bash -n only parses; nothing runs). ~0.3 s."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
CLAIMS = sorted(p for p in RESULTS.iterdir() if p.is_dir())
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _docs():
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(RESULTS.rglob("*.md")),
             *sorted((REPO / "kernels" / "flash-triton").glob("*.md"))]
    return [f for f in files if f.is_file()]


def _broken_links(md: Path, images: bool = True) -> list[str]:
    """Relative link targets in `md` that name no path; `images=False` leaves picture embeds out."""
    text = FENCE.sub("", md.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    bad = []
    for m in LINK.finditer(text):
        if m.group(2) and not images:
            continue
        target = (m.group(1) or m.group(2)).split("#", 1)[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # anchor only, http:, mailto:
            continue
        if not (md.parent / target).exists():
            bad.append(target)
    return bad


def test_there_are_claim_folders():
    assert len(CLAIMS) >= 10, [p.name for p in CLAIMS]


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda p: p.name)
def test_each_claim_has_one_reproduce_script_that_its_readme_names_and_that_parses(claim):
    readme = claim / "README.md"
    assert readme.is_file(), f"{claim.name}/ has no README.md"
    scripts = sorted(p.relative_to(claim).as_posix() for p in claim.rglob("reproduce*.sh"))
    assert scripts == ["reproduce.sh"], f"{claim.name}/ must hold exactly one reproduce.sh, has {scripts}"
    assert "reproduce.sh" in readme.read_text(encoding="utf-8"), f"{claim.name}/README.md does not name reproduce.sh"
    parsed = subprocess.run(["bash", "-n", str(claim / "reproduce.sh")], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr


@pytest.mark.parametrize("md", _docs(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_markdown_link_resolves(md):
    # a report attnprof wrote (not a README) may embed pictures that were not kept beside it (ray/ray/report.md)
    generated = md.is_relative_to(RESULTS) and md.name != "README.md"
    assert _broken_links(md, images=not generated) == []


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "here.md").write_text("x")
    page.write_text("[ok](here.md#top) [web](https://example.com) [gone](missing/README.md) `[code](nowhere.md)`\n"
                    "```\n[fenced](nowhere.md)\n```\n")
    assert _broken_links(page) == ["missing/README.md"]
    (tmp_path / "pic.md").write_text("![plot](plot.png) [gone](gone.md)\n")
    assert _broken_links(tmp_path / "pic.md") == ["plot.png", "gone.md"]
    assert _broken_links(tmp_path / "pic.md", images=False) == ["gone.md"]


def test_scripts_gpu_holds_at_most_fifteen_files():
    files = [p for p in (REPO / "scripts" / "gpu").iterdir() if not p.name.startswith(".")]
    assert len(files) <= 15, sorted(p.name for p in files)
