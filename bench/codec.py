"""The codec's per-message cost, and the two swaps the speed issue asked about.

Run it as ``python -m bench.codec`` (``pip install -e '.[bench]'`` for the swaps). For the
messages of the stream workload (a ``tool.stream`` arguments-delta, the commonest frame,
and a ``tool.result``), per message, best of 5 (``timeit``, µs):

* validation: vrt's compiled predicates (``vrt._core.fastcheck``) against
  ``fastjsonschema``'s generated validator of the same shipped schema (draft-07 view of it:
  ``$schema`` dropped), and jsonschema's ``is_valid`` for scale;
* JSON: the stdlib decoder/encoder the codec uses against ``orjson``;
* the codec's whole ``decode`` and ``encode`` of the message, to see each part's share.

It decides nothing by itself: the choices and their reasons are in bench/README.md.
"""

from __future__ import annotations

import json
import timeit
from collections.abc import Callable
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

from bench.harness import vrt_from
from vrt._core.fastcheck import compile_schema
from vrt._wire import codec
from vrt._wire import messages as m

FRAMES = {
    "tool.stream": '{"type":"tool.stream","seq":5,"callId":"call_1","turnId":"t_1","epoch":0,'
    '"name":"noop","kind":"server","phase":"arguments-delta","delta":"y\\": \\""}',
    "tool.result": '{"type":"tool.result","seq":7,"callId":"call_3","epoch":0,'
    '"result":{"ok":true,"output":{"i":3}}}',
}


def best(f: Callable[[], Any], n: int = 50_000) -> float:
    """µs per call of ``f``, the best of 5 runs of ``n``."""
    return min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6


def optional(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None


def measure(name: str, frame: str, orjson: Any, fastjsonschema: Any) -> list[tuple[str, float]]:
    """The rows of one message type."""
    folder = resources.files("vrt._wire").joinpath("schemas")
    allowed = m.CLIENT_TYPES + m.SERVER_TYPES
    schema = json.loads(folder.joinpath(f"{name}.json").read_text())
    data = json.loads(frame)
    fast = compile_schema(schema)
    rows = [("validate: fastcheck (vrt)", best(lambda: fast(data)))]
    if fastjsonschema is not None:
        generated = fastjsonschema.compile({k: v for k, v in schema.items() if k != "$schema"})
        rows.append(("validate: fastjsonschema", best(lambda: generated(data))))
    slow = Draft202012Validator(schema)
    rows.append(("validate: jsonschema is_valid", best(lambda: slow.is_valid(data), 5_000)))
    rows.append(("parse: json (stdlib, the codec's)", best(lambda: codec.parse(frame))))
    if orjson is not None:
        rows.append(("parse: orjson.loads", best(lambda: orjson.loads(frame))))
    rows.append(("write: json (stdlib, the codec's)", best(lambda: codec._ENCODER.encode(data))))
    if orjson is not None:
        rows.append(("write: orjson.dumps + decode", best(lambda: orjson.dumps(data).decode())))
    message = codec.decode(frame, allowed)
    rows.append(("codec.decode, whole", best(lambda: codec.decode(frame, allowed), 20_000)))
    rows.append(("codec.encode, whole", best(lambda: codec.encode(message), 20_000)))
    return rows


def main() -> None:
    orjson, fastjsonschema = optional("orjson"), optional("fastjsonschema")
    print(f"per message, µs, best of 5; {vrt_from()}")
    for name, frame in FRAMES.items():
        print(f"\n{name} ({len(frame)} bytes)")
        for label, us in measure(name, frame, orjson, fastjsonschema):
            print(f"  {label:38} {us:6.2f}")
    if orjson is None or fastjsonschema is None:
        print("\n(orjson or fastjsonschema not installed: pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
