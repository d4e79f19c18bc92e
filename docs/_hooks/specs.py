"""mkdocs hook: publish the normative spec (specs/**/*.md) under spec/ without copying it.

specs/ stays the single source of truth (it sits next to the golden vectors and is what an
independent implementer reads); the site renders the same files, links between spec files keep
working because the tree is mirrored as it is, and the "Wire format" section of the navigation
lists every spec file, so a new codec's spec appears as soon as it is committed.

Pages may link to the spec by its path in the repository (``[topk](../specs/codecs/topk.md)``),
which also works when the Markdown is read on a code host; the hook rewrites such links to the
rendered copy.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

SECTION = "Wire format (normative)"


def _specs(config: Any) -> list[Path]:
    root = Path(config["config_file_path"]).resolve().parent / "specs"
    return sorted(root.rglob("*.md"))


def _title(rel: str) -> str:
    names = {"format.md": "Container", "rng.md": "Random numbers", "vectors/README.md": "Golden vectors"}
    return names.get(rel, Path(rel).stem)


def on_config(config: Any) -> Any:
    root = Path(config["config_file_path"]).resolve().parent / "specs"
    rels = [p.relative_to(root).as_posix() for p in _specs(config)]
    top = [r for r in rels if "/" not in r]
    top.sort(key=lambda r: (r != "format.md", r))
    codecs = [r for r in rels if r.startswith("codecs/")]
    rest = [r for r in rels if r not in top and r not in codecs]
    section: list[Any] = [{_title(r): f"spec/{r}"} for r in top]
    if codecs:
        section.append({"Codecs": [{_title(r): f"spec/{r}"} for r in codecs]})
    section += [{_title(r): f"spec/{r}"} for r in rest]
    for item in config["nav"] or []:
        if isinstance(item, dict) and SECTION in item:
            item[SECTION] = section
    return config


def on_files(files: Files, config: Any) -> Files:
    root = Path(config["config_file_path"]).resolve().parent / "specs"
    for path in _specs(config):
        rel = path.relative_to(root).as_posix()
        files.append(File.generated(config, f"spec/{rel}", content=path.read_text("utf-8")))
    return files


_LINK = re.compile(r"(\]\()([^)\s#]+\.md)(#[^)\s]*)?(\))")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    repo = Path(config["config_file_path"]).resolve().parent
    specs = repo / "specs"
    docs = Path(config["docs_dir"]).resolve()
    if page.file.src_uri.startswith("spec/"):
        return markdown
    here = (docs / page.file.src_uri).parent

    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith("/"):
            return m.group(0)
        path = Path(os.path.normpath(here / target))
        if specs not in path.parents:
            return m.group(0)
        rendered = docs / "spec" / path.relative_to(specs)
        new = Path(os.path.relpath(rendered, here)).as_posix()
        return f"{m.group(1)}{new}{m.group(3) or ''}{m.group(4)}"

    return _LINK.sub(fix, markdown)
