"""The client: :func:`~.dial.connect` opens connections, :class:`~.client.Client` pumps the
client's protocol core (:mod:`vrt._wire.client`) over them and hands events to
subscribers, :mod:`.reconnect` is each attempt's handshake and the backoff between them,
and :mod:`.apptools` runs the app tools the client hosts."""
