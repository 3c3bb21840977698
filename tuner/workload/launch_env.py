"""The launch environment a workload trains in (:class:`LaunchEnv`): which launcher's rules give each rank its
threads, whether ranks are bound to cores, and the variables that change speed; and what one rank then gets
(:func:`rank_env`). Pure: the launchers resolve it on the rank's node, the exports write it beside the ds_config.

Each launcher's rules, as their sources (deepspeed 0.19.8, torch 2.13, accelerate 1.16) apply them:

- ``deepspeed`` (the default: the launcher a DeepSpeed user runs): the rank inherits the launcher's environment
  (``deepspeed/launcher/launch.py:137``, ``current_env = os.environ.copy()``), so ``OMP_NUM_THREADS`` is the user's,
  and unset it is torch's own default, one thread per physical core (ATen ``intraop_default_num_threads``): every
  rank of a node uses all its cores. ``--bind_cores_to_rank`` (``launch.py:219-222``) splits the node's physical
  cores (``psutil.cpu_count(logical=False)``, ``deepspeed/utils/numa.py:115-116``) into ``cores // local ranks`` per
  rank (``numa.py:119-121``), runs the rank under ``numactl -C`` on its slice and sets ``OMP_NUM_THREADS`` to it.
- ``torchrun``: ``OMP_NUM_THREADS=1`` when the user left it unset and more than one process runs per node, with a
  warning (``torch/distributed/run.py:872-884``); one local process keeps torch's default.
- ``accelerate`` (``accelerate launch`` with DeepSpeed, as the HF export runs): on one machine it runs torchrun
  inside its own environment (``accelerate/commands/launch.py:1138-1139``, ``_run_torchrun``), so torchrun's rule;
  on several it starts DeepSpeed's runner (``commands/launch.py:1130-1136``), so DeepSpeed's. (Without DeepSpeed,
  ``accelerate launch --cpu`` would give ``physical cores // local processes``, ``commands/launch.py:1391-1402``.)

``bind_cores`` binds with DeepSpeed's split under any launcher. ``variables`` override the rule per variable
(``OMP_NUM_THREADS=4`` sets the threads); a trial's own ``dstune.expandable_segments`` is added to
``PYTORCH_CUDA_ALLOC_CONF`` by the runner.

Example:
    >>> env = rank_env(LaunchEnv(), physical_cores=8, local_world_size=2, local_rank=1, inherited={})
    >>> env.threads, env.cores, env.variables["OMP_NUM_THREADS"]
    (8, (), '8')
    >>> bound = rank_env(LaunchEnv(bind_cores=True), physical_cores=8, local_world_size=2, local_rank=1, inherited={})
    >>> bound.threads, bound.cores
    (4, (4, 5, 6, 7))
    >>> rank_env(LaunchEnv("torchrun"), physical_cores=8, local_world_size=2, local_rank=0, inherited={}).threads
    1
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.workload.errors import WorkloadError
from tuner.workload.launch_vars import check_variable
from tuner.workload.vocabulary import LAUNCHER_ENVS

DEFAULT_LAUNCHER = "deepspeed"
THREADS = "OMP_NUM_THREADS"
# what a launcher sets for each rank itself (the rank's place): never a launch variable
RESERVED = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"}
    | {"CUDA_VISIBLE_DEVICES"}
)
SPEED_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF")
NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
TORCH_DEFAULT = "torch's default, one thread per physical core (ATen intraop_default_num_threads)"


def speed_variable(name: str) -> bool:
    """True for the variables a rank reports: threads, ``CUDA_DEVICE_MAX_CONNECTIONS``, the allocator's, ``NCCL_*``.

    >>> speed_variable("NCCL_ALGO"), speed_variable("HOME")
    (True, False)
    """
    return name in SPEED_VARIABLES or name.startswith("NCCL_")


def _positive(value: str | None) -> int | None:
    """``value`` as a positive thread count, or None (unset, or what OpenMP would ignore)."""
    try:
        count = int(value) if value is not None else 0
    except ValueError:
        return None
    return count if count > 0 else None


@dataclass(frozen=True)
class LaunchEnv:
    """Which launcher's rules the ranks run under, whether ranks are bound to cores (``--bind_cores_to_rank``), and
    per-variable overrides (sorted ``(name, value)`` pairs)."""

    launcher: str = DEFAULT_LAUNCHER
    bind_cores: bool = False
    variables: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse a launcher or a variable outside what a launch may set (a :class:`WorkloadError` naming it). Run
        when one is made, and again by the launcher before any rank starts: one unpickled or copied
        was never made."""
        if self.launcher not in LAUNCHER_ENVS:
            raise WorkloadError("launcher-env", f"must be one of {', '.join(LAUNCHER_ENVS)}, got {self.launcher!r}")
        for name, value in self.variables:
            if not NAME.fullmatch(name) or name in RESERVED or name.startswith("DSTUNE_"):
                raise WorkloadError("launch-var", f"{name!r} is not a variable a launch may set")
            check_variable(name, value)  # the allow-list: nothing that loads code, names a file or holds a secret

    @classmethod
    def of(
        cls, launcher: str = DEFAULT_LAUNCHER, bind_cores: bool = False, variables: Mapping[str, str] | None = None
    ) -> LaunchEnv:
        """From a variables mapping (canonicalised: order does not change fingerprints)."""
        pairs = tuple(sorted((str(k), str(v)) for k, v in (variables or {}).items()))
        return cls(launcher, bind_cores, pairs)

    @property
    def overrides(self) -> dict[str, str]:
        """The variables the user set, by name."""
        return dict(self.variables)

    @property
    def is_default(self) -> bool:
        """True for the deepspeed launcher's rules with nothing changed (left out of stored dicts)."""
        return self == LaunchEnv()

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (the inverse of :meth:`from_dict`)."""
        return {"launcher": self.launcher, "bind_cores": self.bind_cores, "variables": self.overrides}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchEnv:
        """Rebuild from :meth:`to_dict`'s output."""
        if not isinstance(data, Mapping):
            raise WorkloadError("launch", "must be an object")
        unknown = set(data) - {"launcher", "bind_cores", "variables"}
        if unknown:
            raise WorkloadError("launch", f"unknown field {sorted(unknown)[0]!r}")
        variables = data.get("variables") or {}
        if not isinstance(variables, Mapping):
            raise WorkloadError("launch-var", "must map variable names to values")
        return cls.of(str(data.get("launcher", DEFAULT_LAUNCHER)), bool(data.get("bind_cores", False)), variables)


@dataclass(frozen=True)
class RankEnv:
    """What one rank runs with: its threads, the cores it is bound to (empty: not bound), the variables set in its
    environment (``OMP_NUM_THREADS`` always, so a rank never inherits a Ray worker's), and the rule that gave the
    threads (its source)."""

    threads: int
    cores: tuple[int, ...]
    variables: dict[str, str]
    rule: str


def _threads_rule(
    launch: LaunchEnv, cores: int, local_world_size: int, nodes: int, user: int | None
) -> tuple[int, str]:
    """(threads, rule) of ``launch``'s launcher with ``user`` the user's own ``OMP_NUM_THREADS``."""
    launcher = launch.launcher
    if launcher == "accelerate":  # several machines: commands/launch.py:1130-1136; one: 1138-1139
        launcher = "deepspeed" if nodes > 1 else "torchrun"
    if user is not None:
        return user, f"{launcher} passes the user's OMP_NUM_THREADS"
    if launcher == "torchrun" and local_world_size > 1:
        return 1, "torchrun: OMP_NUM_THREADS=1 with several local processes (torch/distributed/run.py:872-884)"
    return cores, TORCH_DEFAULT


def rank_env(
    launch: LaunchEnv,
    *,
    physical_cores: int,
    local_world_size: int,
    local_rank: int,
    inherited: Mapping[str, str],
    nodes: int = 1,
    trial_threads: int | None = None,
) -> RankEnv:
    """The environment rank ``local_rank`` of ``local_world_size`` on a node with ``physical_cores`` gets under
    ``launch``, ``inherited`` being the user's environment (what the launcher would pass on); ``trial_threads`` (a
    trial's own ``dstune.threads_per_rank``) sets the threads over every rule."""
    cores = max(1, physical_cores)
    bound: tuple[int, ...] = ()
    if launch.bind_cores:  # deepspeed/utils/numa.py:119-121, launch.py:219-222
        per_rank = max(1, cores // local_world_size)
        first = (per_rank * local_rank) % cores
        bound = tuple(range(first, min(cores, first + per_rank)))
        threads, rule = per_rank, "bound: physical cores // local ranks (deepspeed/utils/numa.py:119-121)"
    else:
        user = _positive(inherited.get(THREADS))
        threads, rule = _threads_rule(launch, cores, local_world_size, nodes, user)
    overrides = launch.overrides
    if THREADS in overrides:
        threads, rule = int(overrides[THREADS]), "--launch-var OMP_NUM_THREADS"
    if trial_threads is not None:
        threads, rule = trial_threads, "the trial's dstune.threads_per_rank (tune --search-threads)"
    variables = {name: value for name, value in inherited.items() if speed_variable(name)}
    variables.update(overrides)
    variables[THREADS] = str(threads)
    return RankEnv(threads, bound, variables, rule)


def launch_command(
    launch: LaunchEnv, gpus_per_node: int, nodes: int, threads: int | None, config_file: str = "ds_config.json"
) -> str:
    """The command line that runs a training script as the measured runs ran: the variables the user set and the
    threads each rank was measured with (``threads``; None: the launcher's rule alone), then the launcher.

    Example:
        >>> launch_command(LaunchEnv(bind_cores=True), 2, 1, 4)
        'OMP_NUM_THREADS=4 deepspeed --num_gpus 2 --bind_cores_to_rank train.py --deepspeed ds_config.json'
        >>> launch_command(LaunchEnv.of("accelerate", variables={"NCCL_ALGO": "Ring"}), 8, 2, 1)  # doctest: +ELLIPSIS
        'NCCL_ALGO=Ring OMP_NUM_THREADS=1 accelerate launch --use_deepspeed --deepspeed_config_file ds_config.json ...'
    """
    variables = launch.overrides
    if threads is not None:
        variables[THREADS] = str(threads)
    prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in sorted(variables.items()))
    world = gpus_per_node * nodes
    if launch.launcher == "deepspeed":
        many = f" --num_nodes {nodes} --hostfile hostfile" if nodes > 1 else ""
        bind = " --bind_cores_to_rank" if launch.bind_cores else ""
        return f"{prefix}deepspeed --num_gpus {gpus_per_node}{many}{bind} train.py --deepspeed {config_file}"
    binding = "numactl -C <the rank's cores> " if launch.bind_cores else ""
    if launch.launcher == "torchrun":
        many = f" --nnodes {nodes} --node_rank <this node> --master_addr <node 0>" if nodes > 1 else ""
        return f"{prefix}torchrun --nproc_per_node {gpus_per_node}{many} {binding}train.py --deepspeed {config_file}"
    many = f" --num_machines {nodes} --machine_rank <this node> --main_process_ip <node 0>" if nodes > 1 else ""
    return (
        f"{prefix}accelerate launch --use_deepspeed --deepspeed_config_file {config_file} "
        f"--num_processes {world}{many} {binding}train.py"
    )


__all__ = [
    "DEFAULT_LAUNCHER",
    "SPEED_VARIABLES",
    "LaunchEnv",
    "RankEnv",
    "launch_command",
    "rank_env",
    "speed_variable",
]
