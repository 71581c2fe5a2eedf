"""`--report report.html`: one self-contained page (plotly.js embedded, nothing fetched), opened in a real
headless Chromium (Debian's, driven by playwright): no console errors, and its charts hold the plan's own
numbers."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from helpers import ENGINE_SKIP

GIB = 1024 ** 3
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or __import__("importlib").util.find_spec("playwright") is None,
    reason=f"{ENGINE_SKIP} chromium and playwright (apt-get install chromium; pip install -e '.[dev]')")


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    from typer.testing import CliRunner

    from gplan.cli import app

    root = tmp_path_factory.mktemp("report")
    plan, page = root / "plan.json", root / "report.html"
    r = CliRunner().invoke(app, ["search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512",
                                 "--out", str(plan), "--report", str(page)])
    assert r.exit_code == 0, r.stderr
    assert f"wrote {page}" in r.stderr.replace("\n", "")
    return json.loads(plan.read_text()), page


def test_the_page_is_self_contained(reported):
    _, page = reported
    text = page.read_text()
    assert text.count("<script") >= 5 and "Plotly" in text
    # nothing to fetch: no script or stylesheet from the network
    assert not re.search(r"<(script|link)[^>]+(src|href)=\"(https?:)?//", text)
    for div in ("pareto", "stage-memory", "schedule", "breakdown", "ranked"):
        assert f'id="{div}"' in text or f"id={div}" in text


@needs_browser
def test_the_report_renders_in_chromium_with_the_plans_numbers(reported, tmp_path):
    from playwright.sync_api import sync_playwright

    plan, page_path = reported
    p = plan["prediction"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            page.wait_for_function("['pareto', 'stage-memory', 'schedule', 'breakdown']"
                                   ".every(id => document.getElementById(id) && document.getElementById(id).data)")
            charts = page.evaluate("""() => Object.fromEntries(['pareto', 'stage-memory', 'schedule', 'breakdown']
                .map(id => [id, document.getElementById(id).data.map(t => ({name: t.name, x: Array.from(t.x),
                 y: Array.from(t.y), base: t.base ? Array.from(t.base) : null}))]))""")
            drawn = page.evaluate("document.querySelectorAll('.main-svg').length")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert errors == [] and drawn >= 4
    traces = {t["name"]: t for t in charts["pareto"]}
    chosen = traces["chosen plan"]
    assert chosen["y"] == pytest.approx([p["step_time_s"]]) and chosen["x"] == pytest.approx([p["memory_bytes_per_device_max"] / GIB])
    assert len(traces["ranked (solved split)"]["y"]) == len(plan["search"]["runner_ups"])
    assert len(traces["fits (even split)"]["x"]) + len(traces["does not fit"]["x"]) == plan["search"]["candidates"]
    budget = min(s["memory_budget_bytes"] for s in p["stages"]) / GIB
    assert traces["memory budget"]["x"] == pytest.approx([budget, budget])
    # on one kind of device a point that does not fit is past the budget, and one that fits is not
    assert min(traces["does not fit"]["x"]) > budget >= max(traces["fits (even split)"]["x"])
    # memory per stage: the stacked terms add up to each stage's predicted memory
    terms = [t for t in charts["stage-memory"] if t["name"] != "budget"]
    for i, stage in enumerate(p["stages"]):
        assert sum(t["y"][i] for t in terms) == pytest.approx(stage["memory_bytes"] / GIB, rel=1e-9)
    # the schedule: every op a bar, none before the step starts; the breakdown: the step's terms
    from gplan.cost_models.timeline import shown_microbatches

    bars = sum(len(t["x"]) for t in charts["schedule"])
    pp = plan["parallel"]["pp"]
    assert bars == 2 * pp * shown_microbatches(pp, p["num_microbatches"])
    assert min(b for t in charts["schedule"] for b in t["base"]) == 0
    assert sum(charts["breakdown"][0]["x"]) == pytest.approx(p["step_time_s"], rel=1e-9)


def test_explain_writes_the_report_of_a_plan(reported, gplan, tmp_path):
    _, page = reported
    plan = page.with_name("plan.json")
    out = tmp_path / "again.html"
    r = gplan("explain", str(plan), "--report", str(out))
    assert r.code == 0 and out.stat().st_size > 1_000_000
