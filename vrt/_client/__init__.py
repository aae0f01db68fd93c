"""The client: :func:`~.dial.connect` opens connections (with resume and backoff), and
:class:`~.client.Client` pumps the client's protocol core (:mod:`vrt._wire.client`) over
them, runs app tools and hands events to subscribers."""
