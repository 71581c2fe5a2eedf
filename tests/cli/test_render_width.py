"""Tables fit 80- and 100-column terminals without cutting a number: rich's own fitting shrinks every
column and ends a cut cell in `…` (`1,9…` for 1,934,567); render.fit keeps numbers whole, wraps words,
folds constant columns into the caption and drops columns in a stated order."""

from __future__ import annotations

import json

import pytest

from gplan import cli
from gplan.testing import cli_json

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
