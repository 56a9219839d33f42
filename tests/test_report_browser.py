"""The HTML report in a real browser: on a laptop screen (1366x768) and a desktop one (1920x1080)
its first screen, before any scrolling, shows the decision: the recommended configuration, its
margins to the SLOs and the `vllm serve` command that launches it.

Headless Chromium (not a project dependency: the tests skip without it) loads a copy of the page
with two small scripts added, one first in <head> that records uncaught errors and one last in
<body> that measures, once the page has loaded, where the decision's parts lie
(`getBoundingClientRect`) and whether the plotly figures drew; it writes the measurements into an
attribute of <html>, which `--dump-dom` prints. No Python dependency is added.

The first screen is the screen less a browser's frame: its tabs and address bar and the
system's taskbar (BROWSER_FRAME_PX), 1366x628 and 1920x940. The page's layout depends on the
window's width only (no viewport heights in its CSS, figures of fixed height), so it is measured
in a window of the screen's size and compared with that fold, not with what headless Chromium
reports as its own viewport (which changes with the profile: 681 or 625 of 768).

The fast test renders the report of `tests.test_report.make_study` (real simulations, no Ray);
the slow one runs `dse search` on studies/quickstart.yaml cut down to 12 small trials, 5
confirmed, whose decision is as tall as the full quickstart's (the configurations measured the
same, headroom, the runner-up, three measured causes).

To look at the first screen by hand (a screenshot's viewport is the whole window):
    chromium --headless --no-sandbox --hide-scrollbars --window-size=1366,628 \
        --screenshot=first_screen.png file:///path/to/report.html
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dse.report_files import write_report
from dse.study import parse_study
from tests.test_report import BASE, CONSTRAINTS, OBJECTIVES, make_study

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome",
                            "google-chrome-stable") if shutil.which(b)), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium or Chrome on PATH")

REPO = Path(__file__).resolve().parent.parent
SCREENS = [(1366, 768), (1920, 1080)]
BROWSER_FRAME_PX = 140      # tabs and address bar (~90 px) and a taskbar (~40-48 px)
ATTR = "data-first-screen"

# First in <head>, before plotly.js and the figures' scripts: every uncaught error is kept.
ERRORS_JS = """<script>window.__errors=[];
addEventListener('error',function(e){__errors.push(String(e.message||e))});
addEventListener('unhandledrejection',function(e){__errors.push('unhandled: '+String(e.reason))});
</script>"""

# Last in <body>: once the page has loaded (and plotly has had a moment), measure the decision.
MEASURE_JS = """<script>addEventListener('load',function(){setTimeout(function(){
function box(el){if(!el)return null;var r=el.getBoundingClientRect();
 return {top:r.top,bottom:r.bottom,left:r.left,right:r.right,height:r.height,
         text:el.textContent.slice(0,160)}}
var d=document.getElementById('recommendation')||document.querySelector('section.decision');
var ps=d?Array.prototype.slice.call(d.querySelectorAll('p')):[];
var margins=ps.filter(function(p){return p.textContent.indexOf('Margins to the SLOs')===0})[0];
var graphs=document.querySelectorAll('.plotly-graph-div');
var drawn=Array.prototype.filter.call(graphs,function(g){return g.querySelector('svg.main-svg')});
document.documentElement.setAttribute('""" + ATTR + """',JSON.stringify({
 innerWidth:innerWidth,innerHeight:innerHeight,scrollY:scrollY,
 decisions:document.querySelectorAll('#recommendation, section.decision').length,
 decision:box(d),heading:box(d&&d.querySelector('h2')),margins:box(margins),
 launch:box(d&&d.querySelector('pre')),
 graphs:graphs.length,drawn:drawn.length,plotly:typeof Plotly,errors:window.__errors}));
},500)});</script>"""


def instrumented(page: Path, out: Path) -> Path:
    """A copy of the report `page` with the error recorder and the measuring script added."""
    text = page.read_text(encoding="utf-8")
    assert text.count("<head>") == 1 and text.count("</body>") == 1
    text = text.replace("<head>", "<head>" + ERRORS_JS, 1).replace("</body>",
                                                                  MEASURE_JS + "</body>", 1)
    out.write_text(text, encoding="utf-8")
    return out


def first_screen(page: Path, width: int, height: int, profile: Path) -> dict:
    """Where the decision lies when `page` opens in a `width` x `height` window."""
    proc = subprocess.run(
        [BROWSER, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
         f"--window-size={width},{height}", "--virtual-time-budget=5000", "--dump-dom",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    m = re.search(rf'{ATTR}="([^"]*)"', proc.stdout)
    assert m, f"the page never measured itself (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html.unescape(m.group(1)))


def assert_decision_first(page: Path, tmp_path: Path, width: int, height: int) -> dict:
    probe = instrumented(page, tmp_path / f"report_{width}x{height}.html")
    s = first_screen(probe, width, height, tmp_path / "profile")
    where = json.dumps(s, indent=1)

    assert not s["errors"], where
    assert s["plotly"] == "object", where
    assert s["graphs"] > 0 and s["drawn"] == s["graphs"], where
    assert s["innerWidth"] == width and s["scrollY"] == 0, where

    fold = height - BROWSER_FRAME_PX
    assert s["decisions"] == 1 and s["decision"] is not None, where
    assert s["heading"] and s["heading"]["text"].startswith("Recommended: trial #"), where
    assert s["launch"] and s["launch"]["text"].startswith("vllm serve "), where
    below = []
    for part in ("heading", "margins", "launch", "decision"):
        b = s[part]
        assert b is not None, f"the decision has no {part}: {where}"
        assert b["height"] > 0 and b["top"] >= 0, f"the decision's {part} is not shown: {where}"
        assert b["right"] <= width, f"the decision's {part} runs off the side: {where}"
        if b["bottom"] > fold:
            below.append(f"{part} ({b['top']:.0f}-{b['bottom']:.0f} px)")
    assert not below, (f"on a {width}x{height} screen the first {fold} px do not hold the "
                       f"decision's {', '.join(below)}: {where}")
    return s


# --- the unit study: real simulations, no Ray --------------------------------------------------


@pytest.fixture(scope="module")
def unit_report(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{folder / 'study.db'}"
    make_study(url)
    study = parse_study({
        "name": "unit", "base": BASE, "objectives": [o.model_dump() for o in OBJECTIVES],
        "constraints": [str(c) for c in CONSTRAINTS],
        "space": {"parameters": {"engine.max_num_seqs": {"type": "categorical",
                                                         "choices": [2, 4, 8, 32, 256]}}},
        "storage": url, "report": {"dir": str(folder / "report")}})
    return write_report(study)["html"]


@pytest.mark.parametrize(("width", "height"), SCREENS, ids=[f"{w}x{h}" for w, h in SCREENS])
def test_the_first_screen_shows_the_decision(unit_report, tmp_path, width, height):
    s = assert_decision_first(unit_report, tmp_path, width, height)
    assert "trial #8" in s["heading"]["text"], s["heading"]


# --- a cut-down quickstart through `dse search` ------------------------------------------------


@pytest.fixture(scope="module")
def quickstart_report(tmp_path_factory) -> Path:
    """studies/quickstart.yaml with 12 trials of 150 requests and 5 confirmed on 300."""
    folder = tmp_path_factory.mktemp("quickstart")
    studies = REPO / "studies"
    data = yaml.safe_load((studies / "quickstart.yaml").read_text())
    data.update(
        name="quickstart-browser",
        base=str((studies / data["base"]).resolve()),
        space=str((studies / data["space"]).resolve()),
        budget={"n_trials": 12}, sampler={**data["sampler"], "n_startup_trials": 6},
        fidelity={"screen": {**data["fidelity"]["screen"], "workload.num_prompts": 150},
                  "confirm": {**data["fidelity"]["confirm"], "workload.num_prompts": 300},
                  "confirm_top_k": 5},
        storage=f"sqlite:///{folder / 'study.db'}", report={"dir": str(folder / "report")})
    study_file = folder / "study.yaml"
    study_file.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "dse.cli", "search", str(study_file)],
                          capture_output=True, text=True, timeout=300, cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder / "report" / "report.html"


@pytest.mark.slow
@pytest.mark.parametrize(("width", "height"), SCREENS, ids=[f"{w}x{h}" for w, h in SCREENS])
def test_the_quickstart_report_opens_on_its_decision(quickstart_report, tmp_path, width,
                                                     height):
    assert_decision_first(quickstart_report, tmp_path, width, height)
