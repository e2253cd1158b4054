"""The directory scan's trend page in a real headless browser (Chromium): laid out, every label inside its
chart and clear of the others, and the 88.72 line and first-hazard marker painted where they belong.

Skipped where no Chromium is installed (Debian: `apt-get install -y chromium`).
"""

import json
import re
import shutil
import struct
import subprocess
import zlib

import pytest

from nanscope.cli.main import main
from nanscope.dumps import demo

BROWSER = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium to render the page")
WIDTH, HEIGHT = 1100, 1200

# Run in the page: what the layout engine made of each chart, as JSON in a <pre id='probe'>.
PROBE = """<script>
const boxes = (svg) => [...svg.querySelectorAll('text')].map(t => {
  const b = t.getBBox(); return {text: t.textContent, x: b.x, y: b.y, w: b.width, h: b.height};
});
const charts = [...document.querySelectorAll('svg')].map(svg => {
  const r = svg.getBoundingClientRect();
  return {left: r.left + scrollX, top: r.top + scrollY, w: r.width, h: r.height, texts: boxes(svg),
          polylines: svg.querySelectorAll('polyline').length, circles: svg.querySelectorAll('circle').length};
});
const pre = document.createElement('pre'); pre.id = 'probe';
pre.textContent = JSON.stringify({charts, width: document.documentElement.scrollWidth, inner: innerWidth});
document.body.appendChild(pre);
</script>"""


def chromium(tmp_path, *args):
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
    ]  # fmt: skip
    done = subprocess.run([BROWSER, *flags, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def png_pixels(path):
    """(width, height, rows of bytes) of an 8-bit RGB or RGBA, non-interlaced PNG, as Chromium writes them."""
    data, pos, idat = path.read_bytes(), 8, b""
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body, pos = data[pos + 8 : pos + 8 + n], pos + 12 + n
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, color in (2, 6), interlace) == (8, True, 0)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp + 1, [], bytearray(w * bpp)
    for y in range(h):
        kind, row = raw[y * stride], bytearray(raw[y * stride + 1 : (y + 1) * stride])
        for i in range(len(row)):
            a = row[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                row[i] = (row[i] + a) & 255
            elif kind == 2:
                row[i] = (row[i] + b) & 255
            elif kind == 3:
                row[i] = (row[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(row)
        prev = row
    return w, h, [bytes(r[j : j + 3]) for r in rows for j in range(0, len(r), bpp)], bpp


def red_near(pixels, w, x, y):
    """Whether the pixel at (x, y), or one beside it, is the page's red #b00020, alone or blended with the white
    behind it (a line on a half pixel is antialiased: #c33f57): red well above green and blue."""
    for dx, dy in ((0, 0), (0, -1), (0, 1), (-1, 0), (1, 0)):
        r, g, b = pixels[(y + dy) * w + (x + dx)]
        if r >= 150 and r - g >= 90 and r - b >= 70:
            return True
    return False


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """The drifting run's trend page as Chromium lays it out (the probe's JSON) and paints it (a screenshot)."""
    root = tmp_path_factory.mktemp("browser")
    demo.write_drifting_run(root / "dumps", rollouts=6)
    page = root / "trend.html"
    assert main(["scan", str(root / "dumps"), "--html", str(page), "--workers", "2"]) == 1
    (root / "probe.html").write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = chromium(root, "--dump-dom", (root / "probe.html").as_uri())
    probe = json.loads(re.search(r"<pre id=\"probe\">(.*?)</pre>", dom, re.S).group(1).replace("&quot;", '"'))
    chromium(root, f"--screenshot={root / 'trend.png'}", page.as_uri())
    return probe, png_pixels(root / "trend.png")


def test_every_label_lies_inside_its_chart_and_clear_of_the_others(rendered):
    probe = rendered[0]
    assert probe["width"] <= probe["inner"]  # no horizontal scrolling
    charts = probe["charts"]
    assert [(c["w"], c["h"], c["polylines"], c["circles"]) for c in charts] == [(960, 340, 4, 21), (960, 340, 3, 15)]
    for chart in charts:
        texts = chart["texts"]
        for t in texts:
            assert t["w"] > 0 and 0 <= t["x"] and t["x"] + t["w"] <= chart["w"], t
            assert 0 <= t["y"] and t["y"] + t["h"] <= chart["h"], t
        for i, a in enumerate(texts):
            for b in texts[i + 1 :]:
                side = a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                assert side or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"], (a, b)
    labels = [t["text"] for t in charts[0]["texts"]]
    assert "fp32 exp overflow 88.72" in labels and "no train dump" in labels
    assert "first hazard: rollout 5 (possibly): the run was heading here" in labels


def test_the_limit_line_and_the_first_hazard_are_painted(rendered):
    probe, (w, h, pixels, _) = rendered
    assert (w, h) == (WIDTH, HEIGHT)
    left, top = round(probe["charts"][0]["left"]), round(probe["charts"][0]["top"])
    # the 88.72 line: chart y 58.8, solid red across the plot, x 56 to 936
    across = sum(red_near(pixels, w, left + x, top + 59) for x in range(60, 930))
    assert across >= 840, across  # of 870: the bound line and its point cross it at rollout 5
    # the first hazard: dashed red (3 on, 3 off) at chart x 924, from y 20 to 252
    down = sum(red_near(pixels, w, left + 924, top + y) for y in range(22, 250))
    assert 100 <= down <= 228, down
    # no red where the plot is empty (below the lines between rollouts 1 and 2, above the TIS line)
    assert not any(red_near(pixels, w, left + x, top + y) for x in range(260, 380) for y in range(222, 246))
