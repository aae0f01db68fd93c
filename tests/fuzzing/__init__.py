"""Fuzzing the sans-IO protocol cores: generated and mutated frames, every outcome counted.

The fuzzer is test code: ``tests/test_fuzz.py`` drives it with Hypothesis draws (a
:class:`~tests.fuzzing.frames.Chooser`), which then shrink whatever it finds, and
``python -m tests.fuzzing`` runs it long from the repository's root (``--cases N`` per
core, 100,000 by default; ``--seed``; ``--quick`` for a smoke run; ``--oracle`` to check
every verdict against jsonschema; ``--help`` for the rest), fed by ``random.Random(seed)``:
a run is reproducible, and fast (Hypothesis's ``.example()`` takes milliseconds a value).
It drives :class:`vrt._wire.server.ServerProtocol` and
:class:`vrt._wire.client.ClientProtocol` directly (no socket, no trio).

- :mod:`tests.fuzzing.frames`: the generator and the mutator (:class:`Frames`);
- :mod:`tests.fuzzing.oracle`: the expected verdict of a frame, from ``json`` and
  jsonschema alone;
- :mod:`tests.fuzzing.drivers`: the checks, the drivers of each core, the sequences;
- :mod:`tests.fuzzing.__main__`: the long run and its report.

* **Frames.** Valid frames of every message type (client messages for the server core,
  server messages for the client core), and mutants of them: fields dropped, added,
  renamed or given the wrong type; huge, negative, fractional and non-JSON numbers
  (``NaN``, ``Infinity``, ``1e400``, 5,000 digits); values nested 2 to 100,000 deep; lone
  surrogates, escaped and raw; binary frames (valid UTF-8, invalid, other encodings:
  all BAD_MESSAGE);
  truncated JSON, duplicated keys, garbage around the object, no object at all; lists
  grown and frames padded to just under, at and over ``max_message_size``; and seq games
  (replays, 0, negative, gaps, huge).
* **Capabilities and batches.** About 42% of hellos offer ``batch-v1`` (and some
  ``local-preview-v1``, ``tool-stream-v1`` and unknown ones); a fifth of the server cores
  support only ``tool-stream-v1``. Welcomes grant ``batch-v1`` and ``local-preview-v1``
  about as often, to client cores most of which offered every capability (some only
  ``tool-stream-v1``, or nothing). Once ``batch-v1`` is negotiated, a third of the frames
  are batches (:meth:`Frames.batch`): arrays of 1 to 5 messages, each valid or with small
  mutations, sometimes an item that is no message (``1``, ``null``, ``[]``, ``{}``...), a
  ``close`` (server) or ``closed`` (client) before the last, the array's text or bytes
  mutated; now and then an empty array, or one of 100, 101, 150 or 400 messages (inputs,
  replays, acks). Arrays also go, rarely, where no batch may: before ``hello`` and in
  sessions without ``batch-v1``.
* **Cases.** A case is one frame delivered to a core (a batch is one case). Cases come in
  sequences of up to 11 frames to a fresh core: for the server, a few frames before
  ``hello``, a ``hello`` (mostly valid), then frames inside the session; for the client,
  after its own ``hello``, a ``welcome`` (mostly valid) and server frames, with the app's
  own actions (run and answer the next app call, interrupt, input) in between.
* **Checks.** Every frame a core queues must decode against its type's schema (the codec
  itself; also jsonschema with ``--oracle``), carry no traceback, and be numbered as
  PROTOCOL.md says; an ``error`` has a known code and a message of at most 500 characters;
  the server returns at most one message a frame (a batch: one a message), of a type its
  state allows, and nothing after ``closed``; neither core's acks ever claim more than was
  sent. A welcome's capabilities are the intersection of the hello's and the server's, and
  each core batches exactly when that intersection holds ``batch-v1``. An array where no
  batch may be, or anything else that is no object, is ``BAD_MESSAGE`` "a frame must be a
  JSON object". A batch over the size limit is ``TOO_LARGE``, an empty one ``BAD_MESSAGE``
  (on the client, its report "an empty batch"), one of over ``BATCH_MESSAGES`` (100)
  messages one ``BAD_MESSAGE`` with none of it read (server). Any other batch must do
  exactly what its messages would have done alone, in order: a copy of the driver taken
  before the frame (its twin) is given them one by one, each checked as a frame of its own
  (an item that is no object as ``null``, whose error then reads "a batch's message must be
  a JSON object"), and the batch must return the same messages or events, queue the same
  frames (acks: the same highest) and leave the core in the same state; the server's
  ``frame_messages`` must be the batch's length (1 for any other frame), and after a
  ``closed`` the client must read no further (PROTOCOL.md: it is final). With
  ``local-preview-v1`` (and ``tool-stream-v1``) each ``ToolPreview`` must follow the
  ``ToolStream`` event of its call it was made from, and a wire ``tool.preview`` give none;
  without it, previews come from ``tool.preview`` frames only. After each sequence the core
  must still work: a valid ``input`` (server) or ``text.delta`` (client) with the next seq
  (with ``batch-v1``, in a batch) is accepted, and an ack of everything sent empties the
  replay buffer. With ``--oracle`` each frame's expected verdict (``TOO_LARGE``,
  ``BAD_JSON``, ``BAD_MESSAGE``, ``UNKNOWN_TYPE``, silently dropped, accepted) is worked out
  independently, from ``json`` and jsonschema, and compared; for a batch, each message's in
  the twin, with the state the messages before it left.

It prints how many cases ended in each outcome, how many escaped with an exception or broke
a check (both should be 0, with the first examples shown otherwise), how many took over
100 ms, and cases per second; then how many sessions negotiated ``batch-v1`` and local
previews, how many batches were read and the outcome of each of their messages (as if it
had come alone), and the known deviations seen (reported, not yet fixed: counted on their
own line, not as broken checks).
"""
