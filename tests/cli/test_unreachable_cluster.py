"""A Ray cluster that does not answer (``--ray-address`` mistyped, or the head down) ends the command with one line
naming it, exit 1 (the environment, not the input), never Ray's traceback."""

from __future__ import annotations

import pytest

from tuner.cli.common import _exit_for_environment
from tuner.storage.environment import environment_failure

RAY_SAYS = "Failed to connect to Ray cluster at 10.255.255.1:6379"  # ray.init(address=...)'s ConnectionError


def test_a_cluster_out_of_reach_is_an_environment_failure() -> None:
    failure = environment_failure(ConnectionError(RAY_SAYS))
    assert failure is not None and str(failure) == f"cannot connect: {RAY_SAYS}"


def test_the_cli_says_it_in_one_line_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        _exit_for_environment(ConnectionError(RAY_SAYS))
    assert ended.value.code == 1
    assert capsys.readouterr().err == f"error: cannot connect: {RAY_SAYS}\n"
