"""A hand-written vrt/1 server for the browser's epoch-gate test: it welcomes the page,
sends an app call of epoch 0, waits for the page's interrupt (epoch 1), then sends another
call of epoch 0 (stale) and prints, as JSON lines, every message the page sent."""

from __future__ import annotations

import json

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, serve_websocket


async def handler(request: WebSocketRequest) -> None:
    ws = await request.accept()
    seq = 0

    async def send(**message: object) -> None:
        nonlocal seq
        seq += 1
        await ws.send_message(json.dumps({**message, "seq": seq}))

    async def receive() -> dict[str, object]:
        while True:
            data = json.loads(await ws.get_message())
            for message in data if isinstance(data, list) else [data]:
                print(json.dumps(message), flush=True)
                if message["type"] != "ack":
                    return dict(message)

    try:
        hello = await receive()
        await send(
            type="welcome",
            sessionId="s_stale",
            resumeToken="t" * 32,
            epoch=0,
            capabilities=hello["capabilities"],
            resumed=False,
            lastSeq=hello["seq"],
        )
        await receive()  # input
        await send(type="turn.started", turnId="t_1", epoch=0)
        call = {"turnId": "t_1", "epoch": 0, "name": "edit"}
        await send(type="tool.call", callId="c1", arguments={"n": 1}, **call)
        while (await receive())["type"] != "interrupt":
            pass
        await send(type="tool.call", callId="c2", arguments={"n": 2}, **call)  # stale now
        while (await receive())["type"] != "tool.result":
            pass
        await send(type="turn.ended", turnId="t_1", epoch=1, reason="interrupted")
        await receive()  # the page's close
        await send(type="closed", reason="client")
    except ConnectionClosed:
        pass


async def main() -> None:
    async with trio.open_nursery() as nursery:
        server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
        print(server.port, flush=True)


if __name__ == "__main__":
    trio.run(main)
