"""A WebSocket proxy that cuts its first connection at one message, for the browser's
fault-injection test: ``python tests/web_cutter.py TARGET_URL DIRECTION N BEFORE [DROP]``.

It prints its port, relays every connection to TARGET_URL message by message, and on the
first one counts the messages in DIRECTION (``send``: page to server; ``receive``: server
to page; a frame that is only an ack is not counted, as in vrt.testing.CuttingConnection):
at the N-th it drops that message (BEFORE=1) or relays it (BEFORE=0), then closes both
sides. The DROP connections after it (0 by default) are accepted and closed at once (a
resume attempt that fails after connecting); later ones (the resume) are relayed
untouched. When the first connection ends it prints ``frames send=S receive=R`` (what it
counted, both ways).
"""

from __future__ import annotations

import json
import sys

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, open_websocket_url, serve_websocket


def counts(message: str) -> bool:
    try:
        data = json.loads(message)
    except ValueError:
        return True
    return not (isinstance(data, dict) and data.get("type") == "ack")


async def main(target: str, direction: str, n: int, before: bool, drop: int) -> None:
    first = [True]
    dropping = [drop]

    async def handler(request: WebSocketRequest) -> None:
        page = await request.accept()
        cutting = first[0]
        first[0] = False
        if not cutting and dropping[0] > 0:
            dropping[0] -= 1
            await page.aclose()
            return
        seen = {"send": 0, "receive": 0}
        async with open_websocket_url(target) as server:

            async def pump(src: object, dst: object, way: str, scope: trio.CancelScope) -> None:
                while True:
                    try:
                        message = await src.get_message()  # type: ignore[attr-defined]
                    except ConnectionClosed:
                        scope.cancel()
                        return
                    cut = False
                    if cutting and counts(message):
                        seen[way] += 1
                        cut = way == direction and seen[way] == n
                    if cut and before:
                        scope.cancel()
                        return
                    try:
                        await dst.send_message(message)  # type: ignore[attr-defined]
                    except ConnectionClosed:
                        scope.cancel()
                        return
                    if cut:
                        scope.cancel()
                        return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, page, server, "send", nursery.cancel_scope)
                nursery.start_soon(pump, server, page, "receive", nursery.cancel_scope)
        with trio.move_on_after(1):
            await page.aclose()
        if cutting:
            print(f"frames send={seen['send']} receive={seen['receive']}", flush=True)

    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        print(server.port, flush=True)


if __name__ == "__main__":
    url, way, count, cut_before = sys.argv[1:5]
    trio.run(main, url, way, int(count), cut_before == "1", int((sys.argv[5:] or ["0"])[0]))
