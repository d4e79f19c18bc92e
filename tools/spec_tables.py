#!/usr/bin/env python
"""Generate the tables of ``specs/format.md`` that the codec registry defines, so they cannot go stale.

    python tools/spec_tables.py            # check: exit 1 and show the difference when stale
    python tools/spec_tables.py --write    # rewrite the generated blocks in place

A generated block lies between ``<!-- BEGIN GENERATED: <name> ... -->`` and
``<!-- END GENERATED: <name> -->`` lines; everything else in the file is left as it is.
``tests/test_spec_tables.py`` fails when a committed block differs from what the registry says.
Only the codecs that ship with gcodec are listed (not third-party entry points).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from gcodec.codecs import registry

ROOT = Path(__file__).resolve().parents[1]
FORMAT_MD = ROOT / "specs" / "format.md"


def builtin_codecs() -> list[type]:
    """The registered codec classes defined inside gcodec, by id."""
    classes = [registry.codec_class(cid) for cid in registry.list_codecs()]
    return [cls for cls in classes if cls.__module__.startswith("gcodec.")]


def codec_table() -> str:
    """One row per codec: id, codec version (C0), specification page, aggregation, nested roles."""
    rows = [
        "| id | version (C0) | specification | aggregation | roles for a nested codec (`hybrid.md`) |",
        "|----|--------------|---------------|-------------|-----------------------------------------|",
    ]
    for cls in builtin_codecs():
        cid = cls.codec_id
        roles = ", ".join(f"`{r}`" for r in getattr(cls, "NESTED_ROLES", ())) or "none: may itself be nested"
        agg = cls.aggregation.value
        if roles[0] == "`" and agg == "summable":  # compose.combined_aggregation
            agg += " (gather with a non-summable nested codec)"
        rows.append(f"| `{cid}` | {cls.version} | [`specs/codecs/{cid}.md`](codecs/{cid}.md) | {agg} | {roles} |")
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[], str]] = {"codec-table": codec_table}


def render(text: str) -> str:
    """``text`` with every generated block replaced by what the registry says now."""
    for name, make in BLOCKS.items():
        pat = re.compile(
            rf"(<!-- BEGIN GENERATED: {re.escape(name)}[^\n]*-->\n)(.*?)(<!-- END GENERATED: {re.escape(name)} -->)",
            re.S,
        )
        if not pat.search(text):
            raise SystemExit(f"no generated block {name!r} in the file")
        text = pat.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(3), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite the generated blocks of specs/format.md")
    args = ap.parse_args(argv)
    old = FORMAT_MD.read_text("utf-8")
    new = render(old)
    if new == old:
        return 0
    if args.write:
        FORMAT_MD.write_text(new, "utf-8")
        print(f"rewrote the generated blocks of {FORMAT_MD.relative_to(ROOT)}")
        return 0
    sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "committed", "registry"))
    print("specs/format.md is stale: run python tools/spec_tables.py --write", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
