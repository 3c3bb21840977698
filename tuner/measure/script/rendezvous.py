"""A free rendezvous port for the user's launcher, so two runs on one host (two trials at once, another job beside
dstune) never meet on torch's default port 29500.

Each launcher is told in its own way: DeepSpeed's ``deepspeed`` gets ``--master_port``, ``accelerate launch`` gets
``--main_process_port`` (both placed before the script, where their parsers read them), torchrun reads
``PET_MASTER_PORT``, and a plain ``python`` run (one process initialising itself) reads ``MASTER_PORT``. A port the
user chose, on the command or in their environment, stays theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuner.measure.script.placement import split_equals

# a launcher run as a module -> its name; the flag that takes a launcher's port (torchrun reads PET_MASTER_PORT)
MODULES = {
    "deepspeed.launcher.runner": "deepspeed",
    "torch.distributed.run": "torchrun",
    "accelerate.commands.launch": "accelerate",
}
PORT_FLAG = {"deepspeed": "--master_port", "accelerate": "--main_process_port"}
# flags that mean the user chose the rendezvous (torchrun's ``--standalone`` finds a free port by itself)
CHOSEN = {
    "deepspeed": ("--master_port",),
    "accelerate": ("--main_process_port",),
    "torchrun": ("--master_port", "--master-port", "--rdzv_endpoint", "--rdzv-endpoint", "--standalone"),
}
ENV_PORT = {"torchrun": "PET_MASTER_PORT", None: "MASTER_PORT"}


@dataclass(frozen=True)
class Rendezvous:
    """The command's arguments and the environment variables that give it the port; ``chosen_by_user`` when the
    command or the environment already named one (then nothing is changed)."""

    argv: list[str]
    env: dict[str, str]
    chosen_by_user: bool


def launcher(argv: list[str]) -> tuple[str | None, int]:
    """The launcher ``argv`` starts (``deepspeed``, ``torchrun``, ``accelerate``; None for a plain script) and the
    index just past its name (``deepspeed``, ``accelerate launch``, ``python -m MODULE``).

    >>> launcher(["python", "-m", "torch.distributed.run", "t.py"])
    ('torchrun', 3)
    """
    name = Path(argv[0]).name if argv else ""
    if name in ("deepspeed", "torchrun"):
        return name, 1
    if name == "accelerate" and argv[1:2] == ["launch"]:
        return "accelerate", 2
    for index in range(len(argv) - 1):
        if argv[index] == "-m" and argv[index + 1] in MODULES:
            return MODULES[argv[index + 1]], index + 2
    return None, 0


def with_port(argv: list[str], env: dict[str, str], port: int) -> Rendezvous:
    """``argv`` and the variables to add to ``env`` so that its launcher meets its ranks on ``port``.

    >>> with_port(["deepspeed", "--num_gpus", "2", "t.py"], {}, 41000).argv
    ['deepspeed', '--master_port', '41000', '--num_gpus', '2', 't.py']
    >>> with_port(["accelerate", "launch", "t.py"], {}, 41000).argv
    ['accelerate', 'launch', '--main_process_port', '41000', 't.py']
    >>> with_port(["torchrun", "--nproc-per-node", "2", "t.py"], {}, 41000).env
    {'PET_MASTER_PORT': '41000'}
    >>> with_port(["python", "t.py"], {"MASTER_PORT": "29999"}, 41000).chosen_by_user
    True
    """
    name, end = launcher(argv)
    words = split_equals(tuple(argv))
    variable = ENV_PORT.get(name)
    if any(word in CHOSEN.get(name or "", ()) for word in words) or (variable is not None and variable in env):
        return Rendezvous(list(argv), {}, True)
    if name in PORT_FLAG:
        return Rendezvous([*argv[:end], PORT_FLAG[name], str(port), *argv[end:]], {}, False)
    return Rendezvous(list(argv), {str(variable): str(port)}, False)
