"""MkDocs hooks for the documentation site.

The machines' diagrams live in ``diagrams/``, where ``vrt diagrams`` writes them and
``vrt diagrams --check`` keeps them current; the site shows those committed files (the
Mermaid index page and the Graphviz SVGs) rather than a copy in ``docs/`` that could drift.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


def on_files(files: Files, config: Any) -> Files:
    """Add every file of ``diagrams/`` to the site, at ``diagrams/``."""
    for path in sorted((ROOT / "diagrams").iterdir()):
        if path.is_file():
            files.append(
                File(
                    f"diagrams/{path.name}",
                    src_dir=str(ROOT),
                    dest_dir=config["site_dir"],
                    use_directory_urls=config["use_directory_urls"],
                )
            )
    return files
