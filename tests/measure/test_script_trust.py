"""Which queued training commands a worker runs (tuner.measure.script.trust): only what lies in the folders it was
told to trust, never inline code or a program of the command's choosing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.trust import trust_refusal


@pytest.fixture
def trusted(tmp_path: Path) -> Path:
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "train.py").write_text("print('train')\n")
    (folder / "ds.json").write_text("{}\n")
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "elsewhere.py").write_text("print('x')\n")
    (folder / "link.py").symlink_to(tmp_path / "elsewhere.py")
    return folder


@pytest.mark.parametrize(
    "argv",
    [
        ["deepspeed", "train.py", "--deepspeed", "ds.json"],
        ["torchrun", "--nproc_per_node", "2", "train.py", "--deepspeed=ds.json"],
        ["python3.11", "-u", "train.py", "-c", "ds.json"],  # the script's own -c, after it
        ["accelerate", "launch", "train.py"],
        ["./run.sh", "-c", "anything"],
    ],
)
def test_a_command_inside_the_trusted_folder_runs(trusted: Path, argv: list[str]) -> None:
    assert trust_refusal(ScriptCommand(tuple(argv), str(trusted)), [trusted]) is None


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["python", "-c", "import os"], "inline"),
        (["python", "-Bc", "import os"], "inline"),
        (["python", "-mpip", "install", "x"], "inline"),
        (["torchrun", "--no-python", "bash", "-c", "id"], "inline"),
        (["deepspeed", "--module", "evil"], "inline"),
        (["accelerate", "launch", "-m", "evil"], "inline"),
        (["bash", "-c", "id"], "neither a launcher"),
        (["/bin/sh", "x"], "outside"),
        (["python", "../elsewhere.py"], "outside"),
        (["python", "link.py"], "outside"),  # a symbolic link out of the folder
        (["deepspeed", "train.py", "--deepspeed", "/etc/passwd"], "outside"),
    ],
)
def test_a_command_reaching_outside_or_running_inline_code_is_refused(trusted: Path, argv: list[str], why: str) -> None:
    refusal = trust_refusal(ScriptCommand(tuple(argv), str(trusted)), [trusted])
    assert refusal is not None and why in refusal, refusal


def test_a_worker_told_to_trust_nothing_runs_no_command_and_a_folder_outside_is_refused(trusted: Path) -> None:
    command = ScriptCommand(("deepspeed", "train.py"), str(trusted))
    assert "--allow-scripts" in (trust_refusal(command, []) or "")
    assert "outside the trusted folders" in (trust_refusal(command, [trusted / "sub"]) or "")
