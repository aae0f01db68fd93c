"""The documentation's examples stay true: every Python block of README.md and of the pages
in docs/ runs, as written, in a fresh interpreter.

A block runs as ``python -c BLOCK`` in an empty folder; one titled with a file name
(```python title="first_agent.py"```) is written to that file and run as ``python FILE``,
or ``python -m pytest FILE`` for a ``test_*.py``. Where a page says what a block prints
("It prints:" and a ``text`` block right after it), the output must be exactly that
(trailing spaces aside). A block that cannot run alone must be marked with
``<!-- fragment: why -->`` on the line before it, and be listed in ``FRAGMENTS``: there are
none today. The blocks run four at a time, in subprocesses, while the tests wait.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^```(?P<lang>\w*)(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.S | re.M)
TITLE = re.compile(r'title="(?P<title>[^"]+)"')
FRAGMENT = re.compile(r"<!-- fragment: (?P<why>[^>]+) -->\n$")

FRAGMENTS: dict[str, str] = {}
"""Blocks that do not run alone, ``page:line`` -> why: keep this small (empty is best)."""

CHECKS: dict[str, re.Pattern[str]] = {
    "README.md:0": re.compile(r"status='finished'"),  # the tour: the turn's TurnResult
    "docs/explanation/machines.md:0": re.compile(r"\A\d+ \d+ \d+\.\ds\n\Z"),  # vrt.check
}
"""Checks of output for blocks whose page shows none (their output varies): ``page:index``
(the index of the Python block in its page) -> a pattern stdout must contain."""

EXTRAS = {
    "opentelemetry.sdk": "trio-vrt[metrics]",
    "hypercorn": "trio-vrt[asgi]",
    "mcp": "trio-vrt[mcp]",
    "vrt.mcp": "trio-vrt[mcp]",
    "mcp_server_time": "mcp-server-time",
    "starlette": "starlette",
    "trustme": "trustme",
    "hypothesis": "hypothesis",
    "pytest": "pytest",
}
"""What a page must tell the reader to install when one of its blocks imports a module
(or runs an MCP server) that ``pip install trio-vrt`` does not bring."""

BASE = {"vrt", "machines", "trio", "attrs", "cattrs", "jsonschema", "httpx2", "h11"}
"""Import names ``pip install trio-vrt`` brings (``opentelemetry`` is the API only)."""


@attrs.frozen(kw_only=True)
class Block:
    """One Python block of a page."""

    page: str  # relative to the root
    index: int  # among the page's Python blocks
    line: int
    code: str
    title: str | None
    prints: str | None  # what the page says it prints
    fragment: str | None  # why it does not run alone

    @property
    def id(self) -> str:
        return f"{self.page}:{self.index}"


def _blocks(path: Path) -> Iterator[Block]:
    text = path.read_text()
    fences = list(FENCE.finditer(text))
    index = 0
    for number, fence in enumerate(fences):
        if fence["lang"] != "python":
            continue
        title = TITLE.search(fence["info"])
        after = fences[number + 1] if number + 1 < len(fences) else None
        prints = None
        if (
            after is not None
            and after["lang"] == "text"
            and text[fence.end() : after.start()].strip() == "It prints:"
        ):
            prints = after["body"]
        fragment = FRAGMENT.search(text, 0, fence.start())
        yield Block(
            page=str(path.relative_to(ROOT)),
            index=index,
            line=text.count("\n", 0, fence.start()) + 1,
            code=fence["body"],
            title=title["title"] if title else None,
            prints=prints,
            fragment=fragment["why"] if fragment and fragment.end() == fence.start() else None,
        )
        index += 1


BLOCKS = [block for page in PAGES for block in _blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.fragment is None]


def _run(block: Block) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as folder:
        if block.title is None:
            command = [sys.executable, "-c", block.code]
        else:
            (Path(folder) / block.title).write_text(block.code)
            runner = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
            command = [
                sys.executable,
                *(runner if block.title.startswith("test_") else []),
                block.title,
            ]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=120, check=False, cwd=folder
        )


Runs = dict[str, Future[subprocess.CompletedProcess[str]]]


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    """Every runnable block started at once, four at a time (most of them wait on sockets
    and timers, not the CPU)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {block.id: pool.submit(_run, block) for block in RUNNABLE}
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_block_runs(block: Block, runs: Runs) -> None:
    """The block exits 0 without a traceback, printing what its page says it prints."""
    done = runs[block.id].result()
    where = f"{block.page}, line {block.line}"
    assert done.returncode == 0, f"{where}:\n{done.stdout[-1000:]}{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr, f"{where}:\n{done.stderr[-2000:]}"
    if block.prints is not None:
        lines = [line.rstrip() for line in done.stdout.splitlines()]
        assert lines == block.prints.splitlines(), f"{where} prints:\n{done.stdout}"
    if block.id in CHECKS:
        assert CHECKS[block.id].search(done.stdout), f"{where} prints:\n{done.stdout}"


def test_fragments_are_few_and_named() -> None:
    """Every block that does not run is marked, with its reason, and listed here."""
    found = {f"{b.page}:{b.line}": b.fragment for b in BLOCKS if b.fragment is not None}
    assert found == FRAGMENTS
    assert len(FRAGMENTS) <= 3


def test_the_pages_have_python_blocks() -> None:
    """The parser finds the blocks (a fence it missed would run nothing), and every check
    names a block that exists."""
    pages = {block.page for block in BLOCKS}
    assert {"README.md", "docs/tutorial/first-agent.md", "docs/how-to/asgi.md"} <= pages
    assert len(BLOCKS) >= 15
    assert set(CHECKS) <= {block.id for block in BLOCKS}
    assert {b.title for b in BLOCKS if b.title} == {"first_agent.py", "test_my_agent.py"}
    assert sum(b.prints is not None for b in BLOCKS) >= 10


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_each_page_says_what_its_blocks_need(block: Block) -> None:
    """A block that imports what ``pip install trio-vrt`` does not bring is on a page that
    says what to install (a newcomer once met ``No module named 'opentelemetry.sdk'``)."""
    page = (ROOT / block.page).read_text()
    modules = set()
    for node in ast.walk(ast.parse(block.code)):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    if '"mcp_server_time"' in block.code:
        modules.add("mcp_server_time")
    for module in modules:
        root = module.split(".")[0]
        needs = [EXTRAS[name] for name in EXTRAS if module == name or module.startswith(name + ".")]
        if needs:
            assert needs[0] in page, f"{block.page} imports {module}: say {needs[0]}"
        elif root != "opentelemetry":
            assert root in BASE or root in sys.stdlib_module_names, (
                f"{block.page} imports {module}: add what it needs to EXTRAS or BASE"
            )


def test_every_page_says_what_to_install() -> None:
    """The tutorial, each how-to guide and each module's reference say what to install."""
    pages = [
        *sorted((ROOT / "docs" / "tutorial").glob("*.md")),
        *sorted((ROOT / "docs" / "how-to").glob("*.md")),
        ROOT / "docs" / "deploy.md",
        *[ROOT / "docs" / "reference" / f"{name}.md" for name in ("vrt", "models", "testing")],
        *[ROOT / "docs" / "reference" / f"{name}.md" for name in ("check", "mcp", "asgi")],
    ]
    for page in pages:
        assert "pip install" in page.read_text(), page


@pytest.mark.parametrize("command", ["demo", "serve", "diagrams", "check"])
def test_the_cli_reference_names_every_option(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/reference/cli.md lists every option the command's --help lists."""
    from vrt._cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    usage = capsys.readouterr().out
    reference = (ROOT / "docs" / "reference" / "cli.md").read_text()
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", usage)) - {"--help"}
    assert options
    for option in options:
        assert f"`{option}" in reference, f"vrt {command} {option}"


def test_the_check_transcript_is_what_the_command_prints() -> None:
    """The machines page's ``vrt check --break epoch-gate`` transcript is what it prints."""
    from vrt import check

    out = io.StringIO()
    check.main(["--calls", "1", "--drops", "0", "--break", "epoch-gate"], out)
    violation = out.getvalue().split("violation ", 1)[1]
    page = (ROOT / "docs" / "explanation" / "machines.md").read_text()
    assert "violation " + violation.rstrip("\n") in page
