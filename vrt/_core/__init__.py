"""The base every layer stands on: pure, synchronous, no trio, no I/O.

The compiled machine tables (:mod:`.tables`), the public records that the engine, the
wire's cores and the client all speak (:mod:`.results`, :mod:`.events`), and the tool
schema check (:mod:`.schema`). The sans-IO wire must not import the Trio engine, and the
client's core builds the same events and runs the same machines as the engine: so these
live below both.
"""
