"""A worker that cannot start once told to (``vrt serve tests.crash_agent:agent``): the
agent of tests/deploy_agent.py, unless the file ``$VRT_TEST_CRASH`` names exists, in which
case loading it stops the process with one line, as a broken deploy or a missing resource
would. The crash-loop test of ``vrt serve --workers`` creates the file after the start."""

from __future__ import annotations

import os
import sys

import vrt
from tests import deploy_agent


def agent() -> vrt.Agent:
    told = os.environ.get("VRT_TEST_CRASH")
    if told and os.path.exists(told):
        sys.exit("vrt serve: the crash agent was told to crash")
    return deploy_agent.agent
