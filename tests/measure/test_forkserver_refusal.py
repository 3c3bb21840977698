"""A node's fork server that fails to start (on a GPU node: its forked children could not use CUDA) is not started
again for every rank of the run: each try costs a whole preload, one rank after another, while rank 0 waits in its
rendezvous. The server here is a real process that refuses as the daemon does (exit 3 with its reason)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tuner.measure.forkserver import ForkServerUnavailable, client


def test_a_server_that_refused_is_not_started_again_for_each_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = tmp_path / "starts"
    refusing = tmp_path / "refusing-server"
    refusing.write_text(
        "#!/bin/sh\necho 'a child forked after the imports cannot use CUDA (the driver was initialised)'\n"
        f"echo start >> {starts}\nexit 3\n"
    )
    refusing.chmod(refusing.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(client.sys, "executable", str(refusing))
    monkeypatch.setattr(client, "_failed_starts", {}, raising=False)
    env = {**os.environ, "MALLOC_ARENA_MAX": f"7{os.getpid()}"}  # a server key of this test's own
    for _rank in range(4):  # the ranks of one run, each asking for a forked process
        with pytest.raises(ForkServerUnavailable, match="cannot use CUDA"):
            client.node_client(env)
    assert starts.read_text().split() == ["start"]
