"""The user's launcher is given a free rendezvous port unless the user chose one."""

from __future__ import annotations

import pytest

from tuner.measure.script.rendezvous import launcher, with_port


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/deepspeed", "--num_gpus", "2", "t.py"], ("deepspeed", 1)),
        (["accelerate", "launch", "--num_processes", "2", "t.py"], ("accelerate", 2)),
        (["accelerate", "env"], (None, 0)),
        (["torchrun", "--nproc-per-node", "2", "t.py"], ("torchrun", 1)),
        (["python", "-m", "deepspeed.launcher.runner", "t.py"], ("deepspeed", 3)),
        (["python", "-u", "t.py", "--deepspeed", "ds.json"], (None, 0)),
    ],
)
def test_the_launcher_is_recognised_by_name_or_module(argv: list[str], expected: tuple[str | None, int]) -> None:
    assert launcher(argv) == expected


def test_deepspeeds_port_goes_before_the_script_where_its_parser_reads_it() -> None:
    meeting = with_port(["deepspeed", "t.py", "--lr", "1"], {}, 40123)
    assert meeting.argv == ["deepspeed", "--master_port", "40123", "t.py", "--lr", "1"]
    assert meeting.env == {} and not meeting.chosen_by_user


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["deepspeed", "--master_port=29600", "t.py"], {}),
        (["accelerate", "launch", "--main_process_port", "29600", "t.py"], {}),
        (["torchrun", "--standalone", "t.py"], {}),
        (["torchrun", "--rdzv-endpoint", "host:29400", "t.py"], {}),
        (["torchrun", "t.py"], {"PET_MASTER_PORT": "29600"}),
        (["python", "t.py"], {"MASTER_PORT": "29600"}),
    ],
)
def test_a_port_the_user_chose_stays_theirs(argv: list[str], env: dict[str, str]) -> None:
    meeting = with_port(argv, env, 40123)
    assert meeting.chosen_by_user and meeting.argv == argv and meeting.env == {}


def test_torchrun_and_a_plain_script_are_told_through_their_environment() -> None:
    assert with_port(["torchrun", "t.py"], {}, 40123).env == {"PET_MASTER_PORT": "40123"}
    assert with_port(["python", "t.py"], {}, 40123).env == {"MASTER_PORT": "40123"}
