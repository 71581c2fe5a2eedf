"""Write a benchmark's table between its two markers in the README (the one place a number lives)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def write_section(begin: str, end: str, text: str, readme: Path = README) -> None:
    """Replace what stands between `begin` and `end` with `text` (on lines of its own)."""
    content = readme.read_text()
    start, stop = content.index(begin) + len(begin), content.index(end)
    readme.write_text(content[:start] + "\n" + text.rstrip("\n") + "\n" + content[stop:])


def table_main(description: str, table, begin: str, end: str, argv: list[str] | None = None) -> int:
    """A benchmark's command line: print its table (`table()`), and with --readme write it into the README."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args(argv)
    text = table()
    print(text)
    if args.readme:
        write_section(begin, end, text)
    return 0
