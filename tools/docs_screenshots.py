"""Build the documentation and take headless Chromium screenshots of its main pages.

    .venv/bin/python tools/docs_screenshots.py                    # build, then docs/_screenshots/*.png
    .venv/bin/python tools/docs_screenshots.py --site docs/_build/html --out /tmp/shots --pages index

Pages: the index, Getting started, the operators guide and the rendered notebook, from its top and
from its "Plot it" section (its figures) (``--pages`` picks some). Each is shot at 1280 x 2400 px (``--window-size``) by Debian's ``chromium`` (``apt-get install
-y chromium`` where it is missing) with a fresh profile and no network use: ``--headless
--no-sandbox --disable-gpu --disable-background-networking --disable-component-update
--disable-sync --no-first-run --user-data-dir=<temporary>``. The PNGs are reduced to a 256-colour
palette (text stays sharp, the files stay small) when Pillow is there.

Before the shots, each page is also loaded with a small script that measures its code blocks in
the same window: a block whose text is wider than its box (cut off at the right edge) is listed
as **clipped**; a block whose lines wrap is listed as wrapped, with how many lines it shows; a
notebook output wider than the page (a wide table) is listed as scrolling in place (its scrollbar
is drawn); the set-up commands (``python3 -m venv ...``) must show each line of theirs on one line. The script exits 1 when a
block is clipped or a set-up command wraps, and prints what it found either way.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"index": "index.html", "getting-started": "guides/getting-started.html",
         "operators": "guides/operators.html", "notebook": "notebooks/explore.html",
         "notebook-plots": "notebooks/explore.html#plot-it"}   # (scrolled to its first figures)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]

# measures every code block once the page's CSS applies (an inline script at the end of <body>
# runs after the stylesheets have loaded), and writes the result into the DOM for --dump-dom
_PROBE = """
<script>
(function () {
  var out = {clipped: [], wrapped: [], blocks: 0};
  document.querySelectorAll('div.highlight pre, div.cell_output pre').forEach(function (p) {
    out.blocks += 1;
    var text = p.textContent.replace(/\\n$/, '');
    var lines = text.split('\\n').length;
    var lh = parseFloat(getComputedStyle(p).lineHeight);
    var pad = parseFloat(getComputedStyle(p).paddingTop) + parseFloat(getComputedStyle(p).paddingBottom);
    var shown = Math.round((p.clientHeight - pad) / lh);
    if (p.scrollWidth > p.clientWidth + 1)
      out.clipped.push({text: text.slice(0, 80), scroll: p.scrollWidth, box: p.clientWidth});
    if (shown > lines)
      out.wrapped.push({text: text.split('\\n')[0].slice(0, 80), lines: lines, shown: shown});
  });
  out.scrolling = [];
  document.querySelectorAll('div.cell_output, div.cell_output *').forEach(function (o) {
    var ox = getComputedStyle(o).overflowX;
    if ((ox === 'auto' || ox === 'scroll' || ox === 'hidden') && o.scrollWidth > o.clientWidth + 1)
      out.scrolling.push({text: o.textContent.trim().slice(0, 60), scroll: o.scrollWidth, box: o.clientWidth,
                          overflow: ox});
  });
  out.anchors = {};
  document.querySelectorAll('section[id]').forEach(function (s) {
    out.anchors[s.id] = Math.round(s.getBoundingClientRect().top + window.scrollY);
  });
  var d = document.createElement('pre');
  d.id = 'rawconv-probe';
  d.textContent = JSON.stringify(out);
  document.body.appendChild(d);
})();
</script>
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit("no Chromium found: apt-get install -y chromium (Debian), then run this again")


def build(site: Path) -> None:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-b", "html", "-q", str(ROOT / "docs"), str(site)],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"sphinx failed (rc {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    print(f"built the site in {time.perf_counter() - t0:.0f} s: {site}")


def _run(browser: str, args: list, profile: Path, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=timeout)


def probe(browser: str, page: Path, size: str, timeout: int) -> dict:
    """The code-block measurements of ``page`` (see the module's docstring)."""
    html = page.read_text(encoding="utf-8")
    probe_page = page.with_name(page.stem + ".probe.html")
    probe_page.write_text(html.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory(prefix="rawconv-chromium-") as profile:
            r = _run(browser, [f"--window-size={size}", "--dump-dom", probe_page.as_uri()], Path(profile), timeout)
    finally:
        probe_page.unlink()
    m = re.search(r'<pre id="rawconv-probe">(.*?)</pre>', r.stdout, re.S)
    if not m:
        raise SystemExit(f"could not measure {page.name} (chromium rc {r.returncode}): {r.stderr[-1500:]}")
    return json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


def shoot(browser: str, page: Path, png: Path, size: str, timeout: int, top: int = 0) -> None:
    """A ``size`` shot of ``page`` from ``top`` px down (a taller window, cropped: headless
    Chromium draws nothing for a page scrolled to a fragment)."""
    width, height = (int(v) for v in size.split(","))
    with tempfile.TemporaryDirectory(prefix="rawconv-chromium-") as profile:
        r = _run(browser, [f"--screenshot={png}", f"--window-size={width},{height + top}", page.as_uri()],
                 Path(profile), timeout)
    if not png.is_file():
        raise SystemExit(f"no screenshot of {page.name} (chromium rc {r.returncode}): {r.stderr[-1500:]}")
    try:
        from PIL import Image
    except ImportError:
        if top:
            raise SystemExit("a shot from a page's section needs Pillow (pip install pillow)") from None
        return
    with Image.open(png) as im:
        small = im.convert("RGB").crop((0, top, width, top + height)).quantize(colors=256,
                                                                             method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, default=None, help="a built site to use (default: build docs/ now)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "_screenshots", help="where the PNGs go")
    ap.add_argument("--pages", nargs="*", default=list(PAGES), choices=list(PAGES), help="which pages")
    ap.add_argument("--window-size", default="1280,2400", help="width,height in px (default 1280,2400)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per Chromium run")
    args = ap.parse_args(argv)

    browser = chromium()
    with tempfile.TemporaryDirectory(prefix="rawconv-site-") as tmp:
        site = args.site or Path(tmp)
        if args.site is None:
            build(site)
        args.out.mkdir(parents=True, exist_ok=True)
        bad = 0
        for name in args.pages:
            path, _, fragment = PAGES[name].partition("#")
            page = site / path
            found = probe(browser, page, args.window_size, args.timeout)
            png = args.out / f"{name}.png"
            if fragment and fragment not in found["anchors"]:
                raise SystemExit(f"{path} has no section #{fragment}; it has: {sorted(found['anchors'])}")
            shoot(browser, page, png, args.window_size, args.timeout, found["anchors"][fragment] if fragment else 0)
            setup_wrapped = [w for w in found["wrapped"] if w["text"].startswith("python3 -m venv")]
            print(f"{name}: {png.relative_to(ROOT) if png.is_relative_to(ROOT) else png} "
                  f"({png.stat().st_size // 1024} KiB); {found['blocks']} code blocks, {len(found['clipped'])} clipped, "
                  f"{len(found['wrapped'])} with wrapped lines")
            for c in found["clipped"]:
                print(f"  CLIPPED ({c['scroll']} px of text in a {c['box']} px box): {c['text']!r}")
            for w in found["wrapped"]:
                print(f"  wrapped: {w['lines']} line(s) shown on {w['shown']}: {w['text']!r}")
            for s in found["scrolling"]:
                print(f"  {'CUT OFF' if s['overflow'] == 'hidden' else 'scrolls in place'} (overflow-x "
                      f"{s['overflow']}; {s['scroll']} px in a {s['box']} px box): {s['text']!r}")
                bad += s["overflow"] == "hidden"
            bad += len(found["clipped"]) + len(setup_wrapped)
            for w in setup_wrapped:
                print(f"  SET-UP COMMAND WRAPS: {w['text']!r}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
