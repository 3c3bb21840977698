"""A Ray address that does not answer ends the command within seconds in one line naming it (Ray's own client retried
a refused port for minutes with nothing printed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.driver.ray_address import check_reachable, gcs_endpoint


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
        ("local", None),
        ("ray://head:10001", None),
        ("head", None),
    ],
)
def test_only_a_host_and_port_is_probed(address: str, endpoint: tuple[str, int] | None) -> None:
    assert gcs_endpoint(address) == endpoint


def test_a_listening_gcs_port_passes_and_a_refused_one_is_a_connection_error() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    with pytest.raises(ConnectionError, match=r"Failed to connect to Ray cluster at 127\.0\.0\.1:\d+") as raised:
        check_reachable(f"127.0.0.1:{_closed_port()}")
    assert raised.value.errno is None  # the client's own, as the CLI's environment failures read Ray's


def test_measure_on_a_refused_ray_address_ends_in_one_line() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    dstune = Path(sys.executable).parent / "dstune"
    command = [str(dstune), "measure", "--model", "tiny-llama", "--gpus", "2", "--device", "cpu"]
    command += ["--launcher", "ray", "--ray-address", address]
    # The bound only keeps a regression from hanging the suite; the fix answers as soon as the port refuses.
    ended = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": ""})
    assert ended.returncode == 1, ended.stderr
    said = f"error: cannot connect: Failed to connect to Ray cluster at {address}: Connection refused"
    assert ended.stderr.strip().splitlines() == [said], ended.stderr
