"""The ``vrt`` command line: ``vrt demo``, ``vrt serve``, ``vrt diagrams``, ``vrt check``."""

from vrt._cli.commands import main

__all__ = ["main"]
