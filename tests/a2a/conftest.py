from __future__ import annotations

import pytest

from tests.helpers import A2AAgentProcess


@pytest.fixture(scope="module")
def a2a_agent():
    """The example order agent served as a real A2A v1.0 server (examples/a2a_agent.py)."""
    proc = A2AAgentProcess().start()
    yield proc
    proc.stop()


@pytest.fixture
def fresh_a2a_agent(a2a_agent):
    a2a_agent.set_faults(reset=True)
    return a2a_agent
