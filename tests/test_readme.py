"""The README's commands and example stay true."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_starts_with_the_two_commands() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", README, re.S)
    assert commands[0].endswith("&& vrt demo")
    assert "pytest" in commands[1]
    assert README.index(commands[0]) < README.index("## ")


def test_tour_example_runs() -> None:
    example = re.findall(r"```python\n(.*?)\n```", README, re.S)[0]  # the tour runs as is
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "status='finished'" in done.stdout


def test_check_example_runs() -> None:
    (example,) = [
        block
        for block in re.findall(r"```python\n(.*?)\n```", README, re.S)
        if "from vrt import check" in block
    ]
    done = subprocess.run(
        [sys.executable, "-c", example], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\d+ \d+ \d+\.\ds\n", done.stdout)


def test_check_transcripts_match_the_command() -> None:
    """The README's `vrt check --break epoch-gate` transcript is what the command prints."""
    from vrt import check

    out = io.StringIO()
    check.main(["--calls", "1", "--drops", "0", "--break", "epoch-gate"], out)
    violation = out.getvalue().split("violation ", 1)[1]
    assert "violation " + violation.rstrip("\n") in README


def test_readme_links_point_into_the_clone() -> None:
    """Every relative link of the README names a file or folder of the project."""
    root = Path(__file__).parent.parent
    links = re.findall(r"\]\(([^)#]+)\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert "docs/protocol.md" in local
    for link in local:
        assert (root / link).exists(), link


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)\n```", README, re.S)


@pytest.mark.parametrize("index", range(len(_python_blocks())))
def test_every_python_block_runs(index: int, tmp_path: Path) -> None:
    """Every Python block of the README is a program that runs as written, in a fresh
    interpreter, and exits (a server it starts is stopped). Placeholders are marked in a
    comment and already filled with something that runs."""
    block = _python_blocks()[index]
    done = subprocess.run(
        [sys.executable, "-c", block],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
