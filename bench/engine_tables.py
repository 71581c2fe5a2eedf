"""The per-engine tables of the docs, written from the engine folders — so that adding an engine
(`src/gplan/engines/<engine>/`) adds its rows without editing a page:

    docs/design.md                what each engine runs and how it keeps memory (its profile's `runs_in_short`,
                                  `memory_in_short`), how a plan is handed to it (its parts)
    docs/replan.md                what its checkpoints load into (its profile's `resharding`)
    docs/exporting.md             what its export writes exactly and what differently (export.py's `EXACT`,
                                  `APPROXIMATED`; the deployments' modules beside them)
    docs/bring-your-own-runs.md   what `--from` and `calibrate` read (launch.py's `FROM_READS`,
                                  `CALIBRATE_READS`) and what `--out-launch` writes (write_back.py's `WRITES_BACK`)

    python bench/engine_tables.py [--readme]    print the tables; with --readme write them into their pages
    python bench/engine_tables.py --check       exit 1 when a page differs from what this writes
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from readme_section import page_of, write_section  # noqa: E402

from gplan.backends.deployments import DEPLOYMENTS  # noqa: E402
from gplan.engines import ENGINES, FOLDERS, LAUNCH_BACKENDS, engine_part, has_part  # noqa: E402
from gplan.engines.profile import DCP_RESHARDS, LAYOUT_DEGREES, Resharding  # noqa: E402

DEGREE_ORDER = (*LAYOUT_DEGREES, "split")


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows])


def handed_over(name: str) -> str:
    """How a plan reaches the engine: gplan's own launch (and the deployments that run that worker), its
    export, or its own launcher."""
    ways = []
    if name in LAUNCH_BACKENDS:
        ways.append("`gplan launch`")
        ways += [f"`gplan export --to {target}`" for target in DEPLOYMENTS if deployment_engine(target) == name]
    if has_part(name, "export"):
        ways.append(f"`gplan export --to {name}`")
    return ", ".join(ways) or "its own launcher (gplan prices it)"


def deployment_engine(target: str) -> str:
    from gplan.backends.exporters import targets

    return targets()[target].engine


def design() -> str:
    rows = [[f"`{name}`", f"`{FOLDERS[name]}/`", e.runs_in_short, e.memory_in_short, handed_over(name)]
            for name, e in ENGINES.items()]
    return table(["engine", "folder", "runs (capabilities, in short)", "memory accounting", "handed over by"], rows)


def degrees(names) -> str:
    return ", ".join(d for d in DEGREE_ORDER if d in names)


def may_change(r: Resharding) -> str:
    if r.optimizer_pins:
        return f"{degrees(r.free - r.optimizer_pins)}; the weights {'any degree' if r.free >= DCP_RESHARDS else degrees(r.free)}"
    every = "every degree and the split" if r.free >= DCP_RESHARDS else degrees(r.free)
    return f"{every} (dense models)" if r.dense_only else every


def kept_unless(r: Resharding) -> str:
    if r.optimizer_pins:
        return f"{degrees(r.optimizer_pins)}: the optimizer state; free with `{r.unpinned_by}` (`gplan replan --optimizer-reshardable`)"
    return "every degree for mixtures of experts (not converted)" if r.dense_only else "—"


def replan() -> str:
    rows = [[e.title, e.resharding.format, may_change(e.resharding), kept_unless(e.resharding),
             e.resharding.conversion or "—", e.resharding.source]
            for e in ENGINES.values()]
    return table(["engine", "checkpoint", "may change", "kept unless", "conversion before loading", "source"], rows)


def exporting() -> str:
    rows = []
    for name, e in ENGINES.items():
        if has_part(name, "export"):
            module = engine_part(name, "export")
            rows.append([f"{e.title} (`--to {name}`; {', '.join(module.VERSIONS)})", module.EXACT, module.APPROXIMATED])
    for target, module_name in DEPLOYMENTS.items():
        module = importlib.import_module(f"gplan.backends.exporters.{module_name}")
        rows.append([f"{module.TITLE} (`--to {target}`; {', '.join(module.VERSIONS)})", module.EXACT, module.APPROXIMATED])
    return table(["engine (written for)", "exact", "approximated or refused"], rows)


def bring_your_own() -> str:
    rows = []
    for name, e in ENGINES.items():
        if not has_part(name, "launch"):
            continue
        launch = engine_part(name, "launch")
        back = engine_part(name, "write_back").WRITES_BACK if has_part(name, "write_back") else "—"
        rows.append([e.title, launch.FROM_READS, launch.CALIBRATE_READS, back])
    return table(["engine", "`--from` reads", "`gplan calibrate` reads", "`--out-launch` writes"], rows)


TABLES = {"engines": design, "resharding": replan, "exports": exporting, "engine-files": bring_your_own}
"""Marker name (`<!-- NAME:begin -->` … `<!-- NAME:end -->`) -> the table written there."""


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(page: Path, name: str) -> str:
    begin, end = markers(name)
    content = page.read_text()
    return content[content.index(begin) + len(begin):content.index(end)].strip("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The docs' per-engine tables, written from the engine folders.")
    parser.add_argument("--readme", "--docs", action="store_true", help="write the tables into their pages")
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from what this writes")
    args = parser.parse_args(argv)
    stale = []
    for name, build in TABLES.items():
        text = build()
        begin, end = markers(name)
        page = page_of(begin)
        if args.check:
            if section(page, name) != text:
                stale.append(f"{page.name} ({name})")
            continue
        print(f"{page.name}:\n{text}\n")
        if args.readme:
            write_section(begin, end, text)
    if stale:
        print(f"stale engine tables: {', '.join(stale)} — run python bench/engine_tables.py --readme", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
