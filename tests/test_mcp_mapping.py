"""``vrt.mcp``'s mapping of MCP to vrt, a table row each (pure functions, no server)."""

from __future__ import annotations

from typing import Any

import pytest

from vrt.mcp import _mapping as mapping

# -- the mapping, a row each ---------------------------------------------------------------------


class Tool:
    def __init__(self, name: str = "t", annotations: Any = None, **fields: Any) -> None:
        self.name = name
        self.annotations = annotations
        for key, value in fields.items():
            setattr(self, key, value)


class Hints:
    def __init__(self, read_only: bool | None = None, destructive: bool | None = None) -> None:
        self.read_only_hint = read_only
        self.destructive_hint = destructive
        self.title = None


@pytest.mark.parametrize(
    ("hints", "risk"),
    [
        (Hints(read_only=True), "low"),
        (Hints(read_only=True, destructive=True), "low"),  # read-only wins
        (Hints(read_only=False, destructive=False), "medium"),
        (Hints(destructive=False), "medium"),
        (Hints(read_only=False, destructive=True), "high"),
        (Hints(read_only=False), "high"),  # MCP's default: it may be destructive
        (Hints(), "high"),
        (None, "high"),  # no annotations at all
    ],
)
def test_risk_from_annotations(hints: Any, risk: str) -> None:
    assert mapping.risk_of(Tool(annotations=hints)) == risk


def test_risk_overrides() -> None:
    tool = Tool("delete_all", annotations=Hints(read_only=True))
    assert mapping.risk_of(tool, "high") == "high"
    assert mapping.risk_of(tool, {"delete_all": "medium"}) == "medium"
    assert mapping.risk_of(tool, {"other": "high"}) == "low"  # not named: its annotations
    assert mapping.risk_of(tool, lambda t: "high" if "delete" in t.name else "low") == "high"
    with pytest.raises(ValueError, match="must be one of"):
        mapping.risk_of(tool, "extreme")  # type: ignore[arg-type]


class Block:
    def __init__(self, **data: Any) -> None:
        self.data = data
        self.type = data.get("type")
        self.text = data.get("text")

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return dict(self.data)


class Result:
    def __init__(self, content: list[Any], structured: Any = None, error: bool = False) -> None:
        self.content = content
        self.structured_content = structured
        self.is_error = error


def test_output_is_structured_content_else_the_blocks() -> None:
    text = Block(type="text", text="21 degrees")
    assert mapping.output_of(Result([text], {"temp": 21})) == {"temp": 21}
    assert mapping.output_of(Result([text, Block(type="image", data="AAA=")])) == [
        {"type": "text", "text": "21 degrees"},
        {"type": "image", "data": "AAA="},
    ]
    assert mapping.output_of(Result([])) == []


def test_an_error_result_is_its_text_bounded() -> None:
    assert mapping.failure_of(Result([Block(type="text", text="no  such\ncity")])) == "no such city"
    long = mapping.failure_of(Result([Block(type="text", text="x" * 10_000)]))
    assert len(long) == mapping.FAILURE_TEXT_LIMIT and long.endswith("...")
    assert mapping.failure_of(Result([])) == "the MCP tool reported an error"


def test_progress_carries_what_the_server_sent() -> None:
    assert mapping.progress_of(2, 8, "page 2") == {"progress": 2, "total": 8, "message": "page 2"}
    assert mapping.progress_of(0.5, None, None) == {"progress": 0.5}


@pytest.mark.parametrize(
    ("name", "prefix", "expected"),
    [
        ("get_current_time", "", "get_current_time"),
        ("get_current_time", "time_", "time_get_current_time"),
        ("trigger-long-running-operation", "", "trigger-long-running-operation"),
        ("files.read/all", "fs_", "fs_files_read_all"),  # what a vrt name may not hold
        ("x" * 80, "", "x" * 64),
    ],
)
def test_names(name: str, prefix: str, expected: str) -> None:
    assert mapping.vrt_name(name, prefix) == expected
