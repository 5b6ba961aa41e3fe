"""The bench report: four pictures, one self-contained HTML page rendered in a real headless Chromium, markdown.

Names from a run are hostile HTML on purpose here (kernel names are full of `<` and `>`); the browser must show
them as text, load every inlined picture, and draw a page that is not blank.
"""

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from attnprof.bench.results import read_results, with_speedups
from attnprof.bench.spec import Cell
from attnprof.bench.sweep import run_sweep
from attnprof.cli import main
from attnprof.report.html import page
from attnprof.report.plots import PLOTS
from attnprof.variants import VARIANTS, Variant
from attnprof.workload import Workload

EVIL_NAME = "evil<script>alert(1)</script>"
EVIL_REASON = "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 4>> & <img src=x onerror=alert(2)>"


def _evil(inputs):
    raise RuntimeError(EVIL_REASON)


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bench")
    cells = [Cell(v, Workload(batch=1, heads=2, seq=s, head_dim=8))
             for s in (16, 32, 64) for v in (VARIANTS["naive"], VARIANTS["sdpa"], VARIANTS["inplace"])]
    cells.append(Cell(Variant(EVIL_NAME, _evil), Workload(batch=1, heads=2, seq=16, head_dim=8)))
    cells.append(Cell(VARIANTS["sdpa-cudnn"], Workload(batch=1, heads=2, seq=16, head_dim=8)))
    run_sweep(cells, d / "results.jsonl", reps=5, warmup=1)
    return d


@pytest.fixture(scope="module")
def report(bench_dir: Path) -> Path:
    assert main(["report", str(bench_dir)]) == 0
    return bench_dir


def test_report_writes_four_pictures_html_and_markdown(report: Path):
    for name, _ in PLOTS:
        img = mpimg.imread(report / name)  # a real PNG, or this raises
        assert img.shape[0] > 200 and img.shape[1] > 300 and float(np.std(img)) > 0.01
    html = (report / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(PLOTS)
    assert not re.search(r'src="(?!data:)', html)  # nothing fetched from beside the page
    md = (report / "report.md").read_text()
    assert all(f"]({name})" in md for name, _ in PLOTS)
    assert "| naive |" in md and "sdpa-cudnn" in md


def test_everything_from_the_run_is_escaped(report: Path):
    html = (report / "report.html").read_text()
    assert "<script" not in html.lower()  # the only tags are ours, and we write no script
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "flash_fwd_kernel&lt;Flash_fwd_kernel_traits&lt;128, 64, 4&gt;&gt; &amp; &lt;img src=x" in html
    assert "<img src=x" not in html
    md = (report / "report.md").read_text()
    assert "<script>" not in md and "&lt;script&gt;" in md


def test_unknown_ceilings_are_said_not_drawn(bench_dir: Path):
    rows = with_speedups(read_results(bench_dir)[0])
    assert all(r["ceilings"]["known"] is False for r in rows)
    assert "ceilings: unknown" in page(rows, {}, "results.jsonl")


# --- the real browser ------------------------------------------------------------------------------------------

PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = Array.from(document.images);
  const broken = imgs.filter(i => !i.complete || i.naturalWidth === 0).length;
  const p = document.createElement('p');
  p.id = 'probe';
  p.textContent = 'images=' + imgs.length + ' broken=' + broken + ' scripts=' + document.scripts.length +
                  ' evil=' + (document.body.textContent.includes('evil<script>alert(1)<\\/script>') ? 1 : 0);
  document.body.appendChild(p);
});
</script></body>"""


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium; .ci/run tries it): "
                    "the HTML report was not rendered in a browser")
    return exe


def browse(page_path: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", *args, page_path.resolve().as_uri()]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run


def probe(html: str, tmp_path: Path) -> dict[str, int]:
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("</body>", PROBE, 1))
    dom = browse(probed, tmp_path, "--virtual-time-budget=5000", "--dump-dom").stdout
    m = re.search(r'id="probe">images=(\d+) broken=(\d+) scripts=(\d+) evil=(\d)<', dom)
    assert m, dom[-2000:]
    return dict(zip(("images", "broken", "scripts", "evil"), map(int, m.groups()), strict=True))


def test_chromium_loads_every_picture_and_shows_names_as_text(report: Path, tmp_path: Path):
    seen = probe((report / "report.html").read_text(), tmp_path)
    assert seen == {"images": len(PLOTS), "broken": 0, "scripts": 1, "evil": 1}  # 1 script: the probe itself


def test_the_probe_itself_sees_a_broken_picture(tmp_path: Path):
    html = '<!doctype html><html><body><img src="data:image/png;base64,AAAA"></body></html>'
    assert probe(html, tmp_path)["broken"] == 1


def test_chromium_screenshot_is_a_drawn_page(report: Path, tmp_path: Path):
    shot = tmp_path / "shot.png"
    browse(report / "report.html", tmp_path, f"--screenshot={shot}", "--window-size=1280,1800",
           "--hide-scrollbars")
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (1800, 1280)
    ink = (img.mean(axis=2) < 0.9).mean()  # share of pixels that are not (near) white
    assert 0.02 < ink < 0.9, ink
    assert float(np.std(img)) > 0.05
    colours = np.unique((img[::4, ::4] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50  # plots in colour, text, tables: not a uniform or two-tone image
