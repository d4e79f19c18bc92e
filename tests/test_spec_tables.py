"""The generated tables of specs/format.md (tools/spec_tables.py) match the codec registry."""

from __future__ import annotations

import spec_tables

import gcodec


def test_committed_codec_table_is_what_the_registry_says():
    text = spec_tables.FORMAT_MD.read_text("utf-8")
    assert spec_tables.render(text) == text, "specs/format.md is stale: run python tools/spec_tables.py --write"


def test_the_table_lists_every_builtin_codec_and_page():
    table = spec_tables.codec_table()
    ids = [c.codec_id for c in spec_tables.builtin_codecs()]
    assert len(ids) == 15 and set(ids) <= set(gcodec.list_codecs())
    for cid in ids:
        assert f"| `{cid}` | 1 | [`specs/codecs/{cid}.md`](codecs/{cid}.md) |" in table
        assert (spec_tables.ROOT / "specs" / "codecs" / f"{cid}.md").is_file()


def test_a_stale_block_is_rewritten():
    begin = "<!-- BEGIN GENERATED: codec-table (tools/spec_tables.py) -->"
    stale = f"x\n{begin}\n| old |\n<!-- END GENERATED: codec-table -->\ny\n"
    new = spec_tables.render(stale)
    assert new.startswith("x\n<!-- BEGIN") and new.endswith("<!-- END GENERATED: codec-table -->\ny\n")
    assert "| old |" not in new and "`powersgd`" in new
