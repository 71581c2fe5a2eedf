"""Tables fit 80- and 100-column terminals without cutting a number: rich's own fitting shrinks every
column and ends a cut cell in `…` (`1,9…` for 1,934,567); render.fit keeps numbers whole, wraps words,
folds constant columns into the caption and drops columns in a stated order."""

from __future__ import annotations

import json

import pytest

from gplan import cli
from helpers import cli_json

WIDTHS = (80, 100)


@pytest.fixture
def narrow(monkeypatch):
    def at(width: int) -> None:
        monkeypatch.setattr(cli.err, "width", width)

    return at


def assert_fits(text: str, width: int) -> None:
    assert text.strip(), "nothing rendered"
    assert "…" not in text, "a cell was cut:\n" + text
    too_long = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert not too_long, f"lines over {width} columns:\n" + "\n".join(too_long)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """A dense and a mixture-of-experts plan, searched once for the module (their --json rows kept)."""
    from typer.testing import CliRunner

    folder = tmp_path_factory.mktemp("plans")
    runner, found = CliRunner(), {}
    for name, args in {"dense": ["llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512"],
                       "moe": ["mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64"]}.items():
        out = folder / f"{name}.json"
        result = runner.invoke(cli.app, ["search", *args, "--out", str(out), "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        found[name] = (out, cli_json(result.stdout))
    return found


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_search_table_keeps_every_number_whole(gplan, narrow, plans, tmp_path, width, kind):
    narrow(width)
    path, searched = plans[kind]
    args = {"dense": ["llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512"],
            "moe": ["mixtral-8x7b", "--cluster", "dgx-h100", "--devices", "64"]}[kind]
    result = gplan("search", *args, "--out", str(tmp_path / "p.json"))
    assert result.code == 0
    assert_fits(result.stderr, width)
    for row in searched["ranked"]:  # each row's throughput, as the table formats it, is there in full
        assert f"{row['prediction']['tokens_per_s']:,.0f}" in result.stderr


@pytest.mark.parametrize("width", WIDTHS)
def test_wide_shows_every_column(gplan, narrow, tmp_path, width):
    narrow(width)
    result = gplan("search", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--gbs", "512",
                   "--out", str(tmp_path / "p.json"), "--wide")
    header = next(line for line in result.stderr.splitlines() if "tokens/s" in line and "┃" in line)
    for column in ("vpp", "cp", "zero", "split", "MFU", "bubble", "comm"):
        assert column in header
    assert "--wide shows all" not in result.stderr


@pytest.mark.parametrize("width", WIDTHS)
def test_other_tables_fit(gplan, narrow, plans, width):
    narrow(width)
    dense, moe = str(plans["dense"][0]), str(plans["moe"][0])
    for args in (["models"], ["hardware"], ["compare", dense, moe], ["explain", dense], ["explain", moe],
                 ["estimate", dense],
                 ["estimate", "llama3-70b", "--cluster", "dgx-h100", "--devices", "64", "--tp", "8", "--pp", "4",
                  "--dp", "2", "--gbs", "512"]):
        result = gplan(*args)
        assert result.code == 0, (args, result.stderr)
        assert_fits(result.stderr, width)


def test_models_table_keeps_names_whole(gplan, narrow):
    from gplan.profiles.catalogue import bundled_models

    narrow(80)
    text = gplan("models").stderr
    for name in bundled_models():
        assert name in text


def test_compare_names_long_files_by_letter_and_shows_each_target(gplan, narrow, plans, tmp_path):
    """A file name is never broken mid-word: when the names would not fit, the columns are A, B, … and the
    names are listed whole beneath; each plan's target is a row."""
    narrow(80)
    names = []
    for kind in ("dense", "moe"):
        path = tmp_path / f"a-rather-long-plan-file-name-for-the-{kind}-search-on-64-h100.json"
        path.write_text(plans[kind][0].read_text())
        names.append(path.name)
    text = gplan("compare", *(str(tmp_path / n) for n in names)).stderr
    assert_fits(text, 80)
    assert f"A  {names[0]}" in text and f"B  {names[1]}" in text
    target_row = next(line for line in text.splitlines() if line.startswith("│ target"))
    targets = [json.loads(plans[kind][0].read_text())["training"]["engine"] for kind in ("dense", "moe")]
    assert [c.strip() for c in target_row.split("│")[2:-1]] == targets
    # names that fit stay the column headers
    text = gplan("compare", str(plans["dense"][0]), str(plans["moe"][0])).stderr
    assert "dense.json" in text and "A  " not in text


def test_search_folds_ties_and_says_what_differs(gplan, tmp_path):
    """Llama 3 8B on one H100 node: zero 1 and zero 2 (and dp × cp swaps) price the same; the table shows
    one row per distinct result and names the folded variants."""
    result = gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--out", str(tmp_path / "p.json"),
                   "--json")
    ranked = result.json()["ranked"]
    rows = [(r["prediction"]["step_time_s"], r["prediction"]["memory_bytes_per_device_max"]) for r in ranked]
    assert len(set(rows)) < len(rows), "the instance has ties (else this test shows nothing)"
    text = gplan("search", "llama3-8b", "--cluster", "dgx-h100", "--devices", "8", "--out", str(tmp_path / "p.json"),
                 "--wide").stderr
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    columns = [c.strip() for c in header.split("┃")[1:-1]]
    body = [line for line in text.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in body]
    steps = [tuple(c[columns.index(k)] for k in ("step", "mem/dev", "recompute", "split")) for c in cells]
    assert len(steps) == len(set(steps)), "no two rows read the same"
    assert len(body) < len(ranked) and "folded into the row shown: zero 2" in " ".join(text.split())


def test_explain_header_says_what_the_stages_recompute(gplan, tmp_path):
    from helpers import TINY_LLAMA, tiny_plan

    plan = tiny_plan(tmp_path / "plan.json", TINY_LLAMA, [[("full", 2)], [("none", 2)]], pp=2)
    header = gplan("explain", str(plan)).stderr.split("stages (per micro-batch")[0]
    assert "rc=full2·none2" in header and "rc=none" not in header
    assert "rc=full2·none2" in gplan("estimate", str(plan)).stderr
