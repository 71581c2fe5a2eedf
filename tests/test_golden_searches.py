"""What `gplan search` picks on six instances, and what `gplan export` writes for the dense one, against
tests/data/golden/ (tests/golden.py). A change to the cost model or the search that moves a pick fails here
with the difference; after a deliberate change, regenerate with `python tests/golden.py` and review
`git diff tests/data/golden`."""

from __future__ import annotations

import difflib
import json

import pytest

from golden import EXPORT_FROM, FOLDER, INSTANCES, ROOT, exports, pick, run_search

REGENERATE = "after a deliberate change: python tests/golden.py, then review git diff tests/data/golden"


def diff(expected: str, got: str, name: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True), f"golden/{name}", "now"))


@pytest.mark.parametrize("name", sorted(INSTANCES))
def test_the_search_picks_what_it_picked(name, tmp_path):
    golden = json.loads((FOLDER / f"{name}.json").read_text())
    args = [str(ROOT / a) if a.startswith("bench/") else a for a in golden["args"]]
    got = pick(run_search(args, tmp_path / "plan.json"))
    expected, now = json.dumps(golden["pick"], indent=1), json.dumps(got, indent=1)
    assert now == expected, f"{name}: the search now picks otherwise ({REGENERATE})\n" + diff(expected, now, name)


def test_the_six_instances_cover_what_they_are_named_for():
    picks = {name: json.loads((FOLDER / f"{name}.json").read_text())["pick"] for name in INSTANCES}
    assert picks["moe-mixtral-8x7b-h100-64"]["parallel"]["ep"] > 1
    assert picks["interleaved-gpt3-175b-a100-1024"]["parallel"]["vpp"] > 1
    assert picks["cp-llama3-8b-h100-16-seq32k"]["parallel"]["cp"] > 1
    assert len({s["node_group"] for s in picks["heterogeneous-llama3-8b-a100-v100"]["stages"]}) == 2
    assert picks["ascend-llama2-7b-910b-64"]["target"] == "mindspore"


def test_the_exports_write_what_they_wrote(tmp_path):
    golden = json.loads((FOLDER / f"{EXPORT_FROM}.json").read_text())
    plan = tmp_path / "plan.json"
    run_search(golden["args"], plan)
    for file, text in exports(plan).items():
        expected = (FOLDER / "exports" / file).read_text()
        assert text == expected, f"export {file} changed ({REGENERATE})\n" + diff(expected, text, file)
