"""The HTML report rendered by a real headless Chromium: titles in the DOM, every plot draws, the page is not blank."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import List

import pytest

from harness.report.build import build_report
from harness.report.html import TITLES
from tests.unit.report.synthetic_runs import make_sweep

pytestmark = pytest.mark.browser

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
WINDOW = (1280, 2400)
# Injected into a copy of the report: rasterise every inline SVG plot on a canvas, count the pixels that
# are not background and the distinct colours, sort the results table by a column; write the findings
# into the DOM for --dump-dom to carry out.
PROBE = r"""
<script>
(function () {
  var out = {plots: {}, sorted: null};
  function done() { document.getElementById('probe-result').textContent = JSON.stringify(out); }
  var header = Array.prototype.find.call(document.querySelectorAll('#results-table th'),
                                         function (th) { return th.textContent === 'tokens/s/device'; });
  header.click(); header.click();  // descending
  var col = Array.prototype.indexOf.call(header.parentNode.children, header);
  out.sorted = Array.prototype.map.call(document.querySelectorAll('#results-table tbody tr'),
                                        function (tr) { return tr.cells[col].dataset.sort || null; });
  var plots = document.querySelectorAll('svg.plot'), pending = plots.length;
  plots.forEach(function (svg) {
    var img = new Image();
    img.onload = function () {
      var c = document.createElement('canvas');
      c.width = svg.width.baseVal.value; c.height = svg.height.baseVal.value;
      var ctx = c.getContext('2d'); ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, c.width, c.height);
      ctx.drawImage(img, 0, 0);
      var d = ctx.getImageData(0, 0, c.width, c.height).data, ink = 0, colours = new Set();
      for (var k = 0; k < d.length; k += 4) {
        if (d[k] < 245 || d[k + 1] < 245 || d[k + 2] < 245) ink++;
        colours.add((d[k] << 16) | (d[k + 1] << 8) | d[k + 2]);
      }
      out.plots[svg.id] = {ink: ink, colours: colours.size, width: c.width, height: c.height};
      if (--pending === 0) done();
    };
    img.onerror = function () { out.plots[svg.id] = 'error'; if (--pending === 0) done(); };
    var xml = new XMLSerializer().serializeToString(svg);
    img.src = 'data:image/svg+xml;base64,' + btoa(unescape(encodeURIComponent(xml)));
  });
})();
</script>
"""
PIXELS = r"""
<!DOCTYPE html><html><body><pre id="probe-result"></pre>
<img id="shot" src="data:image/png;base64,{data}">
<script>
var img = document.getElementById('shot');
function count() {
  var c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
  var ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
  var d = ctx.getImageData(0, 0, c.width, c.height).data, ink = 0, colours = new Set();
  for (var k = 0; k < d.length; k += 4) {
    if (d[k] < 245 || d[k + 1] < 245 || d[k + 2] < 245) ink++;
    colours.add((d[k] << 16) | (d[k + 1] << 8) | d[k + 2]);
  }
  document.getElementById('probe-result').textContent =
    JSON.stringify({ink: ink, pixels: d.length / 4, colours: colours.size});
}
if (img.complete) count(); else img.onload = count;
</script></body></html>
"""


def _install_chromium() -> str:
    """Debian's chromium, installed with apt when missing; skip (saying why) only when that cannot work."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if not shutil.which("apt-get") or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be installed here (needs apt-get as root): "
                    "apt-get install -y chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
        except subprocess.TimeoutExpired:
            pytest.skip(f"chromium could not be installed: {' '.join(argv)} took over 900 s")
        if proc.returncode != 0:
            pytest.skip(f"chromium could not be installed: {' '.join(argv)} failed: {proc.stderr[-500:]}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("chromium could not be installed: apt-get succeeded but no chromium on PATH")
    return found


@pytest.fixture(scope="session")
def chromium() -> str:
    return _install_chromium()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    first = make_sweep(root / "results", "cpu_grid")
    return build_report([first], first)["html"]


def run_chromium(chromium: str, args: List[str], profile: Path, timeout: int = 120) -> str:
    proc = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def dump_dom(chromium: str, page: Path, profile: Path) -> str:
    return run_chromium(chromium, ["--virtual-time-budget=10000", "--dump-dom", page.as_uri()], profile)


def probe_result(dom: str) -> dict:
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', dom, re.S)
    assert match and match.group(1), dom[-2000:]
    return json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def test_titles_and_answer_are_in_the_rendered_dom(chromium, report, tmp_path):
    dom = dump_dom(chromium, report, tmp_path / "profile")
    for title in ("throughput", "mfu", "memory", "step_times", "status", "results"):
        assert f"<h2>{TITLES[title]}</h2>" in dom, title
        assert TITLES[title] in dom
    assert "Which layout should I use?" in dom
    assert "Use dp2 tp1 zero2 mb2: " in dom
    assert len(re.findall(r'<svg class="plot"', dom)) == 4


def test_every_plot_draws(chromium, report, tmp_path):
    page = tmp_path / "probe.html"
    page.write_text(report.read_text().replace("</body>", '<pre id="probe-result"></pre>' + PROBE + "</body>"))
    result = probe_result(dump_dom(chromium, page, tmp_path / "profile"))
    plots = result["plots"]
    assert set(plots) == {"chart-throughput", "chart-mfu", "chart-memory", "chart-step-times"}
    for name, found in plots.items():
        assert found != "error", name
        area = found["width"] * found["height"]
        assert found["ink"] > 0.02 * area, (name, found)  # bars, axes and text, not an empty frame
        assert found["colours"] >= 8, (name, found)
    values = [float(v) for v in result["sorted"] if v not in (None, "None")]
    assert values == sorted(values, reverse=True) and len(values) == 3  # the sort script ran


def test_screenshot_is_not_blank(chromium, report, tmp_path):
    shot = tmp_path / "report.png"
    run_chromium(chromium, [f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", report.as_uri()],
                 tmp_path / "profile")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == WINDOW
    page = tmp_path / "pixels.html"
    page.write_text(PIXELS.replace("{data}", base64.b64encode(data).decode()))
    pixels = probe_result(dump_dom(chromium, page, tmp_path / "profile"))
    assert pixels["pixels"] == width * height
    assert pixels["ink"] > 0.03 * pixels["pixels"], pixels
    assert pixels["colours"] > 50, pixels
