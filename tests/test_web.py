"""The browser client's files: machines.js is generated from machines/ and current, and its
tables, run by Node, accept exactly what the Python tables accept."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from vrt._cli import main, webtables
from vrt._core.tables import Table

NODE = shutil.which("node")


def test_the_committed_machines_js_is_current() -> None:
    assert webtables.check() == []
    assert main(["diagrams", "--check", "--dir", "diagrams"]) == 0


def test_a_changed_machine_makes_machines_js_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    webtables.write(tmp_path)
    assert webtables.check(tmp_path) == []
    table = webtables.CALL_VIEW
    changed = dict(table.transitions)
    changed["issued", "progress"] = "settled"
    monkeypatch.setattr(table, "transitions", changed)
    assert webtables.check(tmp_path) == [f"{tmp_path / 'machines.js'}: stale (a class in "
                                         "machines/ changed)"]  # fmt: skip
    assert webtables.check(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere/machines.js'}: missing"]


def _python_answers(table: Table) -> dict[str, dict[str, str | None]]:
    return {
        state: {event: table.transitions.get((state, event)) for event in table.events}
        for state in table.states
    }


def test_node_runs_the_same_tables() -> None:
    """Every (state, event) pair of every exported machine, in Node: the same target, or
    InvalidTransition where Python refuses."""
    assert NODE is not None, "node is needed (.ci/run installs it)"
    script = f"""
    import * as m from {json.dumps((webtables.WEB / "machines.js").as_uri())};
    const out = {{}};
    for (const [name, events] of Object.entries({
        json.dumps({name: list(t.events) for name, t in webtables.EXPORTED})
    })) {{
      const table = m[name];
      out[name] = {{}};
      for (const state of Object.keys(table.transitions)) {{
        out[name][state] = {{}};
        for (const event of events) {{
          const machine = new m.Machine(table);
          machine.state = state;
          try {{ out[name][state][event] = machine.send(event); }}
          catch (e) {{
            if (!(e instanceof m.InvalidTransition)) throw e;
            out[name][state][event] = null;
          }}
        }}
      }}
      const fresh = new m.Machine(table);
      out[name].__initial = fresh.state;
      out[name].__finals = table.finals;
    }}
    console.log(JSON.stringify(out));
    """
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(done.stdout)
    for name, table in webtables.EXPORTED:
        answers = dict(got[name])
        assert answers.pop("__initial") == table.initial
        assert set(answers.pop("__finals")) == set(table.finals)
        assert answers == _python_answers(table), name
