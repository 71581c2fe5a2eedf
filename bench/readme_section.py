"""Write a benchmark's table between its two markers — in the README (a headline) or in its docs page —
the one place each number lives. The file is the one that holds the markers."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def page_of(begin: str) -> Path:
    """The README or docs page holding the marker `begin` (exactly one does)."""
    pages = [p for p in [README, *sorted((ROOT / "docs").glob("*.md"))] if begin in p.read_text()]
    if len(pages) != 1:
        raise SystemExit(f"{begin}: in {len(pages)} pages ({', '.join(p.name for p in pages) or 'none'}), not one")
    return pages[0]


def write_section(begin: str, end: str, text: str, readme: Path | None = None) -> None:
    """Replace what stands between `begin` and `end` with `text` (on lines of its own)."""
    page = readme or page_of(begin)
    content = page.read_text()
    start, stop = content.index(begin) + len(begin), content.index(end)
    page.write_text(content[:start] + "\n" + text.rstrip("\n") + "\n" + content[stop:])


def table_main(description: str, table, begin: str, end: str, argv: list[str] | None = None) -> int:
    """A benchmark's command line: print its table (`table()`), and with --readme write it into its page."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--readme", "--docs", action="store_true", help="write the table into its page (README or docs/)")
    args = parser.parse_args(argv)
    text = table()
    print(text)
    if args.readme:
        write_section(begin, end, text)
    return 0


def first_block(text: str, blocks: int = 2) -> str:
    """The first `blocks` paragraphs of a table's text (a headline: its caption and its first table)."""
    return "\n\n".join(text.strip("\n").split("\n\n")[:blocks])
