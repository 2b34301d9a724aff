"""The HTML report rendered by a real headless Chromium: titles in the DOM, every plotly plot draws and hovers,
the page is not blank; screenshots are kept among the test artifacts."""

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

from harness import REPO_ROOT
from harness.report.build import build_report
from harness.report.html import TITLES
from tests.unit.report.synthetic_runs import make_sweep

pytestmark = pytest.mark.browser

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
WINDOW = (1280, 2400)
ARTIFACTS = Path(os.environ.get("HARNESS_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts")) / "report"
# Injected into a copy of the report: once plotly has drawn, count each plot's bars and boxes, hover its first
# point with plotly's own Fx.hover and keep the hover text; sort the results table by a column; write the
# findings into the DOM for --dump-dom to carry out.
PROBE = r"""
<script>
window.addEventListener('load', function () { setTimeout(function () {
  var out = {plots: {}, sorted: null};
  var header = Array.prototype.find.call(document.querySelectorAll('#results-table th'),
                                         function (th) { return th.textContent === 'tokens/s/device'; });
  header.click(); header.click();  // descending
  var col = Array.prototype.indexOf.call(header.parentNode.children, header);
  out.sorted = Array.prototype.map.call(document.querySelectorAll('#results-table tbody tr'),
                                        function (tr) { return tr.cells[col].dataset.sort || null; });
  document.querySelectorAll('div.plot .js-plotly-plot').forEach(function (gd) {
    var hover = '';
    try {
      Plotly.Fx.hover(gd, [{curveNumber: 0, pointNumber: 0}]);
      var box = gd.querySelector('g.hovertext'); hover = box ? box.textContent : '';
    } catch (e) { hover = 'error: ' + e; }
    out.plots[gd.id] = {bars: gd.querySelectorAll('g.point').length,
                        boxes: gd.querySelectorAll('g.trace.boxes path.box').length,
                        hover: hover, width: gd.offsetWidth, height: gd.offsetHeight};
  });
  document.getElementById('probe-result').textContent = JSON.stringify(out);
}, 500); });
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


def keep(shot: Path, name: str) -> Path:
    """A copy of a screenshot among the test artifacts (HARNESS_TEST_ARTIFACTS, default test-artifacts/)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / name
    shutil.copyfile(shot, kept)
    return kept


def test_titles_and_answer_are_in_the_rendered_dom(chromium, report, tmp_path):
    dom = dump_dom(chromium, report, tmp_path / "profile")
    for title in ("throughput", "mfu", "memory", "step_time_parts", "step_times", "status", "results"):
        assert f"<h2>{TITLES[title]}</h2>" in dom, title
    assert "Which layout should I use?" in dom
    assert "Use dp2 tp1 zero2 mb2: " in dom
    # plotly.js loaded from the file beside the report (no network) and drew all five plots.
    assert (report.parent / "plotly.min.js").exists()
    assert len(re.findall(r'class="[^"]*js-plotly-plot', dom)) == 5


def test_every_plot_draws_and_hovers_with_the_runs_layout(chromium, report, tmp_path):
    page = report.parent / "probe.html"
    page.write_text(report.read_text().replace("</body>", '<pre id="probe-result"></pre>' + PROBE + "</body>"))
    result = probe_result(dump_dom(chromium, page, tmp_path / "profile"))
    plots = result["plots"]
    assert set(plots) == {"chart-throughput", "chart-mfu", "chart-memory", "chart-step-time-parts",
                          "chart-step-times"}
    for name, found in plots.items():
        assert found["width"] > 300 and found["height"] > 150, (name, found)
        assert not found["hover"].startswith("error"), (name, found)
    assert plots["chart-throughput"]["bars"] >= 8 and plots["chart-memory"]["bars"] >= 8
    assert plots["chart-step-time-parts"]["bars"] >= 8  # a measured bar per run, predicted parts where known
    assert plots["chart-step-times"]["boxes"] == 3  # one box per completed run
    hover = plots["chart-throughput"]["hover"]
    assert hover.startswith("dp2 tp1 zero2 mb2") and "ZeRO-2" in hover and "tokens/s/device: " in hover, hover
    assert "step min / max: " in hover and "MFU: " in hover, hover
    values = [float(v) for v in result["sorted"] if v not in (None, "None")]
    assert values == sorted(values, reverse=True) and len(values) == 3  # the sort script ran


def test_screenshot_is_not_blank_and_is_kept(chromium, report, tmp_path):
    shot = tmp_path / "report.png"
    run_chromium(chromium, ["--virtual-time-budget=10000", f"--screenshot={shot}",
                            f"--window-size={WINDOW[0]},{WINDOW[1]}", report.as_uri()], tmp_path / "profile")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == WINDOW
    keep(shot, "report.png")
    page = tmp_path / "pixels.html"
    page.write_text(PIXELS.replace("{data}", base64.b64encode(data).decode()))
    pixels = probe_result(dump_dom(chromium, page, tmp_path / "profile"))
    assert pixels["pixels"] == width * height
    assert pixels["ink"] > 0.03 * pixels["pixels"], pixels
    assert pixels["colours"] > 50, pixels


def test_compare_report_has_one_answer(chromium, tmp_path):
    roots = [make_sweep(tmp_path / "results" / name, "cpu_grid").parent for name in ("monday", "tuesday")]
    paths = build_report(roots, tmp_path / "compare")
    dom = dump_dom(chromium, paths["html"], tmp_path / "profile")
    assert dom.count('class="headline"') == 1 and re.search(r"Fastest measured: [^<]* from cpu_grid \((monday|tuesday)", dom)
    shot = tmp_path / "compare.png"
    run_chromium(chromium, ["--virtual-time-budget=10000", f"--screenshot={shot}",
                            f"--window-size={WINDOW[0]},{WINDOW[1]}", paths["html"].as_uri()], tmp_path / "profile")
    keep(shot, "compare.png")


# At 1,400 px: where the results table's layout headers sit, whether each is inside the table's visible box,
# how many columns are hidden; then tick a hidden column in the picker and see it appear; the noise caption's
# style beside the headline's.
WIDE_PROBE = r"""
<script>
window.addEventListener('load', function () { setTimeout(function () {
  var table = document.getElementById('results-table'), box = table.parentNode.getBoundingClientRect();
  var out = {layout: {}, hidden: 0, picked: null, caption: null, headline: null, viewport: window.innerWidth};
  table.querySelectorAll('thead th').forEach(function (th) {
    var r = th.getBoundingClientRect();
    if (th.offsetWidth === 0) { out.hidden++; }
    out.layout[th.textContent] = {left: r.left, right: r.right, width: th.offsetWidth,
                                  inside: th.offsetWidth > 0 && r.left >= box.left && r.right <= box.right};
  });
  var picker = document.querySelector('details.picker'); picker.open = true;
  var th = table.querySelector('th[data-key="flop_convention"]'), before = th.offsetWidth;
  var tick = picker.querySelector('input[data-col="' + th.dataset.col + '"]');
  tick.checked = true; tick.dispatchEvent(new Event('change'));
  var cell = table.querySelector('tbody td[data-col="' + th.dataset.col + '"]');
  out.picked = {before: before, after: th.offsetWidth, cell: cell.offsetWidth};
  function style(el) { var s = getComputedStyle(el);
    return {size: parseFloat(s.fontSize), weight: parseInt(s.fontWeight, 10), height: el.offsetHeight}; }
  out.caption = style(document.querySelector('p.caption.noise'));
  out.headline = style(document.querySelector('.headline .answer'));
  document.getElementById('probe-result').textContent = JSON.stringify(out);
}, 300); });
</script>
"""
SHOTS = Path(os.environ.get("HARNESS_REPORT_SHOTS", ARTIFACTS))


def noisy_report(root: Path) -> Path:
    """The synthetic sweep with one run's step times spread wide, so the report carries a noise caption."""
    sweep_dir = make_sweep(root / "results", "cpu_grid")
    metrics = sweep_dir / "0" / "metrics.json"
    payload = json.loads(metrics.read_text())
    times = payload["measured"]["step_times_s"]
    payload["measured"]["step_times_s"] = [*times[:-1], 3 * times[-1]]
    metrics.write_text(json.dumps(payload))
    return build_report([sweep_dir], sweep_dir)["html"]


def test_at_1400_px_the_layout_columns_show_and_the_picker_reveals_the_rest(chromium, tmp_path):
    report = noisy_report(tmp_path)
    page = report.parent / "wide.html"
    page.write_text(report.read_text().replace("</body>", '<pre id="probe-result"></pre>' + WIDE_PROBE + "</body>"))
    result = probe_result(run_chromium(chromium, ["--virtual-time-budget=10000", "--window-size=1400,1000",
                                                  "--dump-dom", page.as_uri()], tmp_path / "profile"))
    assert result["viewport"] == 1400
    for header in ("layout", "status", "tp", "pp", "zero", "micro-batch", "sharding", "tokens/s", "MFU"):
        assert result["layout"][header]["inside"], (header, {k: v for k, v in result["layout"].items() if v["width"]})
    assert result["hidden"] > 20  # the other figures wait behind the picker
    assert result["picked"]["before"] == 0 and result["picked"]["after"] > 0 and result["picked"]["cell"] > 0
    caption, answer = result["caption"], result["headline"]
    assert caption["size"] >= 0.85 * answer["size"] and caption["weight"] >= answer["weight"], (caption, answer)
    shot = tmp_path / "report-1400.png"
    run_chromium(chromium, ["--virtual-time-budget=10000", f"--screenshot={shot}", "--window-size=1400,5200",
                            report.as_uri()], tmp_path / "profile")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep(shot, "report-1400.png")
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SHOTS / "report-1400.png")
