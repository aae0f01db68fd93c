"""The committed diagrams are current, and the check notices when they are not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from vrt._cli import diagrams as _diagrams
from vrt._cli import main
from vrt._core.tables import TABLES

COMMITTED = Path(__file__).parent.parent / "diagrams"


def test_committed_diagrams_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagrams", "--check", "--dir", str(COMMITTED)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("stem", ["tool_call.mmd", "turn.svg", "README.md"])
def test_check_names_the_stale_file(
    tmp_path: Path, stem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "diagrams"
    shutil.copytree(COMMITTED, folder)
    path = folder / stem
    text = path.read_text()
    path.write_text(
        text.replace("vrt-dot-sha256: ", "vrt-dot-sha256: 0")
        if stem.endswith(".svg")
        else text.replace("settled", "done")
    )
    assert main(["diagrams", "--check", "--dir", str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: stale" in err
    (folder / "call_view.mmd").unlink()
    assert main(["diagrams", "--check", "--dir", str(folder)]) == 1
    assert f"{folder / 'call_view.mmd'}: missing" in capsys.readouterr().err


def test_a_changed_machine_makes_its_diagrams_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    table = TABLES[0]
    changed = dict(table.transitions)
    changed["settled", "interrupt"] = "cancelled"  # what an edit to the class would do
    monkeypatch.setattr(table, "transitions", changed)
    assert _diagrams.dot_hash(table) not in (COMMITTED / "tool_call.svg").read_text()
    assert any("tool_call.svg: stale" in p for p in _diagrams.check(COMMITTED))


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz is not installed")
def test_svg_is_the_same_on_every_run(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    _diagrams.write(first)
    _diagrams.write(second)
    for path in first.iterdir():
        assert path.read_text() == (second / path.name).read_text(), path.name


def test_mermaid_and_dot_come_from_the_class() -> None:
    for table in TABLES:
        text = _diagrams.dot(table)
        for (source, event), target in table.transitions.items():
            assert f'"{source}" -> "{target}"' in text
            assert event in text
        assert f"[*] --> {table.initial}" in _diagrams.mermaid(table)
