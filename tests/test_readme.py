"""The README's commands and links stay true (its Python block runs in tests/test_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_starts_with_the_two_commands() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", README, re.S)
    assert commands[0].endswith("&& vrt demo")
    assert "pytest" in commands[1]
    assert README.index(commands[0]) < README.index("## ")


def test_readme_links_point_into_the_clone() -> None:
    """Every relative link of the README names a file or folder of the project."""
    root = Path(__file__).parent.parent
    links = re.findall(r"\]\(([^)#]+)\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert "docs/protocol.md" in local
    for link in local:
        assert (root / link).exists(), link
