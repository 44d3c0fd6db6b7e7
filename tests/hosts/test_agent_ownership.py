"""The controller's side of agent ownership (issue 20 item 3): a second AgentPair (another
experiment) is refused by agents the first holds, naming it, and its failure rolls nothing of
the first back; with ``--take-over-agents`` (``[hosts] take_over``: ``AgentPair(take_over=True)``) it takes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from musku import owner
from musku.domain import Configuration
from musku.errors import HostError
from musku.hosts.agent import AgentHost, AgentPair, SocketLink
from tests.agent.helpers import THP
from tests.hosts.test_agent_pair import _pair, _stop

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


def test_second_experiment_refused_then_taken_over(tmp_path: Path) -> None:
    first, daemons = _pair(tmp_path)
    links = [SocketLink(cfg.socket) for _, _, cfg in daemons]
    second = AgentPair((AgentHost("a", links[0]), AgentHost("b", links[1])), name="other")
    try:
        first.apply((Configuration.of({"thp": "always"}),) * 2)
        with pytest.raises(HostError) as info:
            second.apply((Configuration.of({"thp": "never"}),) * 2)
        msg = info.value.one_line()
        assert "held by experiment 't'" in msg and owner.controller_id() in msg
        assert all("[always]" in h.read(THP) for _, h, _ in daemons)  # first's state intact
        third = AgentPair(
            (AgentHost("a", links[0]), AgentHost("b", links[1])), name="other", take_over=True
        )
        third.apply((Configuration.of({"thp": "never"}),) * 2)
        assert all("[never]" in h.read(THP) for _, h, _ in daemons)
        assert links[0].call("status")["owner"]["experiment"] == "other"
        third.restore()
        third.close()
    finally:
        first.close()
        second.close()
        _stop(daemons)
