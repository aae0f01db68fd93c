"""The agent of the production-serving tests (``vrt serve tests.deploy_agent:agent``).

Its model keeps nothing between steps: what it says depends only on the request, so any
node can run any turn, and what it says tells the test what history it saw: ``turn N, K
inputs seen, M interrupted``. An input starting with ``slow`` streams ten words over a
second first; one starting with ``app`` calls the client's ``note`` app tool with the
input's text, then says the line once the result is in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import trio

import vrt
from vrt.models import CallEnd, CallStart, Text, TurnInterrupted, UserInput


class Stateless:
    async def stream(self, request: vrt.ModelRequest) -> AsyncIterator[Any]:
        history = request.history
        inputs = [h for h in history if isinstance(h, UserInput)]
        text = inputs[-1].text if inputs else ""
        if text.startswith("app") and request.step == 1:
            call_id = f"c_{request.session_id[-6:]}_{request.turn_id}"
            yield CallStart(call_id=call_id, name="note")
            yield CallEnd(call_id=call_id, arguments={"text": text})
            return
        if text.startswith("slow"):
            for i in range(10):
                yield Text(text=f"{i} ")
                await trio.sleep(0.1)
        marked = sum(isinstance(h, TurnInterrupted) for h in history)
        number = request.turn_id.removeprefix("t_")
        yield Text(text=f"turn {number}, {len(inputs)} inputs seen, {marked} interrupted")


agent = vrt.define_agent(model=Stateless(), client_tools="accept")
