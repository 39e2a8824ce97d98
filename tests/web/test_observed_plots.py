"""The plan page's predicted-vs-observed and residual plots (app.js ``observedPlot`` and
``residualPlot``), run in node against a minimal DOM: one dot per observation at its observed
step, the plan's interval bar, one residual point per observation, a marker where the
calibration version changes, and text set as textContent only.  Skipped without node."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "planner_service" / "web" / "app.js"

SHIM = """
class Node {}
class El extends Node {
  constructor(tag) { super(); this.tag = tag; this.attrs = {}; this.children = []; this.textContent = ""; }
  setAttribute(k, v) { this.attrs[k] = v; }
  append(c) { this.children.push(c); }
  replaceChildren(...c) { this.children = c; }
  addEventListener() {}
}
global.Node = Node;
global.document = { createElementNS: (ns, t) => new El(t), createElement: (t) => new El(t), createTextNode: (t) => ({ text: t }) };
function flat(el, out = []) { if (el && el.tag) { out.push(el); el.children.forEach((c) => flat(c, out)); } return out; }
"""


def _extract(source: str, start: str) -> str:
    """The source of the function (or const) that begins with ``start`` up to its closing brace."""
    i = source.index(start)
    depth, j, opened = 0, i, False
    while True:
        c = source[j]
        if c == "{":
            depth, opened = depth + 1, True
        elif c == "}":
            depth -= 1
            if opened and depth == 0:
                return source[i : j + 1] + (";" if start.startswith("const") else "")
        j += 1


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_observed_and_residual_plots_draw_every_observation():
    src = APP.read_text()
    parts = [_extract(src, s) for s in ("function h(", "const fmt = {", "function svg(", "function observedPlot(", "function residualPlot(")]
    parts.insert(2, 'const SVG_NS = "http://www.w3.org/2000/svg";')
    observed = {"predicted_step_time_s_p10": 0.9, "predicted_step_time_s_p90": 1.2,
                "history": [{"step_time_s": 1.3, "predicted_step_time_s": 1.0, "calibration_version": 0, "created_at": "2026-12-01T10:00:00Z"},
                            {"step_time_s": 1.25, "predicted_step_time_s": 1.28, "calibration_version": 1, "created_at": "2026-12-01T11:00:00Z"}]}
    cal = {"version": 2, "residuals": [
        {"log_residual": 0.01, "public_log_residual": -0.26, "calibration_version_at_observation": 0, "observed_step_s": 1.3, "created_at": "x"},
        {"log_residual": -0.02, "public_log_residual": -0.22, "calibration_version_at_observation": 1, "observed_step_s": 1.25, "created_at": "y"},
        {"log_residual": 0.0, "public_log_residual": -0.24, "calibration_version_at_observation": 1, "observed_step_s": 1.27, "created_at": "z"}]}
    script = SHIM + "\n".join(parts) + f"""
const o = flat(observedPlot({json.dumps(observed)}));
const r = flat(residualPlot({json.dumps(cal)}));
console.log(JSON.stringify({{
  dots: o.filter((e) => e.attrs["data-observed"] !== undefined).map((e) => [Number(e.attrs["data-observed"]), Number(e.attrs.cx)]),
  bars: o.filter((e) => e.tag === "rect").length,
  residuals: r.filter((e) => e.attrs["data-residual"] !== undefined).map((e) => [Number(e.attrs["data-residual"]), Number(e.attrs.cy)]),
  versions: r.filter((e) => e.tag === "text" && /^v\\d+$/.test(e.textContent)).map((e) => e.textContent),
  publics: r.filter((e) => e.tag === "circle" && e.attrs.fill === "none").length,
  ids: [o[0].attrs.id, r[0].attrs.id],
}}));
"""
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["ids"] == ["observed-plot", "residual-plot"]
    assert [v for v, _ in d["dots"]] == [1.3, 1.25] and d["dots"][0][1] > d["dots"][1][1]  # slower step further right
    assert d["bars"] == 2  # the plan's interval on each row
    assert [v for v, _ in d["residuals"]] == [0.01, -0.02, 0.0]
    assert d["residuals"][0][1] < d["residuals"][2][1] < d["residuals"][1][1]  # positive error drawn higher
    assert d["versions"] == ["v0", "v1"] and d["publics"] == 3
    assert not re.search(r"innerHTML|insertAdjacentHTML", _extract(APP.read_text(), "function observedSection("))


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_the_observed_peak_is_shown_in_the_units_predictions_are_in():
    """Observed peaks are stored in GB of 10^9 bytes; the page shows them in GiB as the allocator
    prints them (the units of the prediction beside them) and in GB."""
    src = APP.read_text()
    script = "\n".join(_extract(src, s) for s in ("const fmt = {", "function observedPeak(")) + """
console.log(JSON.stringify([observedPeak(72.27, 77.6, 72.0), observedPeak(null, null, 72.0)]));
"""
    out = json.loads(subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout)
    assert out[0] == "observed 72.3 GiB as printed (77.6 GB), predicted 72.0 GB"
    assert out[1] == "observed –, predicted 72.0 GB"
