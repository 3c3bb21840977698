"""Which of DeepSpeed's compiled ops a run will build first, so a face can say so before a silent minute or three.

DeepSpeed compiles its C++ ops on first use (``torch.utils.cpp_extension.load``) into torch's extensions folder,
``TORCH_EXTENSIONS_DIR``, one folder per op holding ``<op>.so``, and reuses them afterwards. Torch's own default,
``~/.cache/torch_extensions/py311_cpu``, is shared by every environment of a user: two virtualenvs (two torch or
DeepSpeed copies, two ninjas) each read the other's build as stale and rebuild it, minutes per op on every alternation.
So dstune's processes build into a folder of their own environment, ``py311_cpu/dstune-<env>-<hash>`` below that
default, the hash of the environment's prefix and of its torch and DeepSpeed versions (:func:`use_environment_builds`),
unless ``TORCH_EXTENSIONS_DIR`` says otherwise.

On CPU every run needs ``deepspeed_shm_comm``
(``init_distributed``); DeepSpeed's Adam needs ``cpu_adam`` with optimizer offload and ``fused_adam`` otherwise, unless
the config asks for torch's Adam (``"torch_adam": true``). Nothing here imports torch or DeepSpeed.

Example:
    >>> offload = {"offload_optimizer": {"device": "cpu"}}
    >>> ops_needed("cpu", {"optimizer": {"type": "AdamW"}, "zero_optimization": offload})
    ['deepspeed_shm_comm', 'cpu_adam']
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import runpy
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tuner.workload import TrialConfig
from tuner.workload.zero import offload_device

if TYPE_CHECKING:
    from tuner.measure.measurement import Measurement, StepHook
    from tuner.measure.options import MeasureOptions
    from tuner.workload import TrialConfig, Workload

SHM_COMM = "deepspeed_shm_comm"
CPU_ADAM = "cpu_adam"
FUSED_ADAM = "fused_adam"
ADAM_TYPES = ("adam", "adamw")
OP_BUILDERS = {SHM_COMM: "ShareMemCommBuilder", FUSED_ADAM: "FusedAdamBuilder", CPU_ADAM: "CPUAdamBuilder"}
_BUILD = (
    "import sys; from tuner.measure.op_builds import use_environment_ninja; use_environment_ninja(); "
    "from deepspeed.accelerator import get_accelerator; "
    "[get_accelerator().create_op_builder(name).load(verbose=False) for name in sys.argv[1:]]"
)


def ops_needed(device: str, ds_config: Mapping[str, Any]) -> list[str]:
    """The compiled ops a run of ``ds_config`` on ``device`` (``cpu`` or ``cuda``) loads, in load order."""
    ops = [SHM_COMM] if device == "cpu" else []
    trial = TrialConfig.of(ds_config)
    if "optimizer" not in trial.ds_config:  # DeepSpeed builds no optimizer of its own
        return ops
    if str(trial.optimizer_type).lower() in ADAM_TYPES and not trial.optimizer_params.get("torch_adam"):
        offloaded = offload_device(trial.ds_config, "offload_optimizer") != "none"
        ops.append(CPU_ADAM if offloaded else FUSED_ADAM)
    return ops


def environment_ninja_path(path: str, bin_dir: str | None = None) -> str:
    """``PATH`` with the interpreter's own scripts folder first when it holds a ``ninja`` (pip's, which DeepSpeed
    requires), so every process builds and checks DeepSpeed's ops with the same ninja.

    Two ninjas on one host (a system ``ninja-build`` 1.11 and pip's 1.13) hash a build's command differently: each
    reads the other's build log as stale, and whichever process's ``PATH`` finds the other one recompiles every op,
    minutes of a CPU per op. An activated virtualenv, a Ray job or a test that puts the scripts folder first would
    flip between them.

    Example:
        >>> environment_ninja_path("/usr/bin:/bin", bin_dir="/nonexistent")
        '/usr/bin:/bin'
    """
    bin_dir = bin_dir or os.path.dirname(sys.executable)
    if not os.path.isfile(os.path.join(bin_dir, "ninja")):
        return path
    rest = [entry for entry in path.split(os.pathsep) if entry and entry != bin_dir]
    return os.pathsep.join([bin_dir, *rest])


def use_environment_ninja() -> None:
    """Put the interpreter's ninja first on this process's ``PATH`` (:func:`environment_ninja_path`)."""
    os.environ["PATH"] = environment_ninja_path(os.environ.get("PATH", os.defpath))


def extensions_dir(
    env: Mapping[str, str] | None = None, build_tag: str | None = None, prefix: str | None = None
) -> Path:
    """Where dstune's runs build extensions: ``TORCH_EXTENSIONS_DIR``, else this environment's own folder below torch's
    default (its Python/torch subfolder), named after the environment's ``prefix`` (default ``sys.prefix``).

    Example:
        >>> extensions_dir({"TORCH_EXTENSIONS_DIR": "/cache/ext"})
        PosixPath('/cache/ext')
        >>> extensions_dir({"XDG_CACHE_HOME": "/c"}, build_tag="cu128").parent.parent
        PosixPath('/c/torch_extensions')
        >>> extensions_dir({"HOME": "/h"}, "cpu", "/opt/a/.venv") != extensions_dir({"HOME": "/h"}, "cpu", "/b/.venv")
        True
    """
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    cache = env.get("XDG_CACHE_HOME", str(Path(env.get("HOME") or Path.home()) / ".cache"))
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    root = Path(os.path.realpath(Path(cache) / "torch_extensions"))
    return root / f"{python}_{build_tag or torch_build_tag()}" / environment_name(prefix or sys.prefix)


def environment_name(prefix: str, versions: str | None = None) -> str:
    """The build folder's name for the environment at ``prefix``: its folder's name and a hash of its real path and
    of the torch and DeepSpeed it holds (``versions``, default :func:`installed_versions`), so an upgrade builds
    afresh in a folder of its own and the build line says so, instead of a silent rebuild in the old one.

    >>> environment_name("/opt/dstune/.venv", "torch 2.13.0, deepspeed 0.19.8")
    'dstune-.venv-15ef5106'
    """
    real = os.path.realpath(prefix)
    key = f"{real}\n{installed_versions() if versions is None else versions}"
    return f"dstune-{Path(real).name}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


@functools.cache
def installed_versions() -> str:
    """The versions of torch and DeepSpeed this interpreter would import (``?`` for one not installed), read from
    their metadata without importing them."""
    found = []
    for package in ("torch", "deepspeed"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} ?")
    return ", ".join(found)


def use_environment_builds() -> None:
    """This process's (and its children's) DeepSpeed op builds in this environment's own folder
    (:func:`extensions_dir`; a ``TORCH_EXTENSIONS_DIR`` given is kept), checked with its own ninja
    (:func:`use_environment_ninja`)."""
    os.environ["TORCH_EXTENSIONS_DIR"] = str(extensions_dir())
    use_environment_ninja()


def torch_build_tag() -> str:
    """``cpu``, ``cu128`` or ``rocm62``: the build of the installed torch, read from ``torch/version.py``."""
    values = _package_file_values("torch", "version.py")
    if values.get("hip"):
        return "rocm" + str(values["hip"]).replace(".", "")
    if values.get("cuda"):
        return "cu" + str(values["cuda"]).replace(".", "")
    return "cpu"


def prebuilt_ops() -> set[str]:
    """Ops compiled when DeepSpeed was installed (``DS_BUILD_OPS=1``): they are never built at run time."""
    installed = _package_file_values("deepspeed", "git_version_info_installed.py").get("installed_ops") or {}
    return {name for name, built in installed.items() if built}


def missing_ops(ops: Iterable[str], root: Path, prebuilt: Collection[str] = ()) -> list[str]:
    """The ops of ``ops`` with neither a build under ``root`` nor a prebuilt copy, without repeats."""
    missing: list[str] = []
    for op in ops:
        if op not in missing and op not in prebuilt and not (root / op / f"{op}.so").is_file():
            missing.append(op)
    return missing


def build_notice(
    device: str,
    ds_configs: Iterable[Mapping[str, Any]],
    *,
    env: Mapping[str, str] | None = None,
    prebuilt: Collection[str] | None = None,
    skip: Collection[str] = (),
) -> tuple[str | None, list[str]]:
    """One line saying which ops the runs of ``ds_configs`` will build first, and those ops (except ``skip``).

    ``(None, [])`` when every op is already built.
    """
    root = extensions_dir(env)
    needed = [op for config in ds_configs for op in ops_needed(device, config) if op not in skip]
    missing = missing_ops(needed, root, prebuilt_ops() if prebuilt is None else prebuilt)
    if not missing:
        return None, []
    kind = "CPU ops" if device == "cpu" else "ops"
    return f"Building DeepSpeed's {kind} ({', '.join(missing)}) once; later runs reuse them from {root}", missing


def build_ops(ops: Iterable[str]) -> bool:
    """Build ``ops`` now, in a child interpreter of this environment (its folder, its ninja), before the run that
    needs them starts: a build inside a run counts against the run's timeout, and one killed there is removed and
    started again by the next run, so on a slow or loaded machine every trial could time out building. False when
    the build failed (no compiler, ...): the run then meets the same failure and says why."""
    names = [OP_BUILDERS[op] for op in ops if op in OP_BUILDERS]
    if not names:
        return True
    done = subprocess.run([sys.executable, "-c", _BUILD, *names], capture_output=True, text=True, check=False)
    return done.returncode == 0


def _package_file_values(package: str, filename: str) -> dict[str, Any]:
    """The module-level values of a small generated file of ``package``, without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return {}
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0]) / filename if locations else None
    if path is None or not path.is_file():
        return {}
    try:
        return runpy.run_path(str(path))
    except Exception:  # an unexpected file: assume nothing was prebuilt and torch is a CPU build
        return {}


class _Submitter(Protocol):
    slots: int

    def submit(
        self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None
    ) -> Future[Measurement]: ...

    def cancel(self) -> None: ...


class AnnounceBuilds:
    """Wraps a dispatcher: says, before a run, which of DeepSpeed's ops it needs built (once per op), builds them
    outside the run's timeout, then runs it.

    It has the dispatcher's ``slots``, ``submit`` and ``cancel``, so the study takes it wherever it takes one.
    """

    def __init__(
        self, inner: _Submitter, say: Callable[[str], None], build: Callable[[list[str]], bool] = build_ops
    ) -> None:
        self.inner, self.say, self.build, self.slots = inner, say, build, inner.slots
        self.prebuilt = prebuilt_ops()
        self.announced: set[str] = set()

    def submit(self, workload: Workload, trial: TrialConfig, on_step: StepHook | None = None) -> Future[Measurement]:
        """Announce the ops this run needs that are not built yet, build them (:func:`build_ops`), and submit it."""
        device = workload.cluster.device
        notice, ops = build_notice(device, [trial.ds_config], prebuilt=self.prebuilt, skip=self.announced)
        if notice:
            self.announced.update(ops)
            self.say(notice)
            self.build(ops)
        return self.inner.submit(workload, trial, on_step)

    def cancel(self) -> None:
        """Cancel the inner dispatcher's runs."""
        self.inner.cancel()


def announced(inner: _Submitter, options: MeasureOptions, say: Callable[[str], None]) -> _Submitter:
    """``inner`` wrapped in :class:`AnnounceBuilds` (each build said through ``say``, and made before its run) where
    the runs' ranks, and so their builds, are on this machine: the local launcher or a private local Ray, running
    dstune's trainer (a training command builds what its own optimizer needs, in its own environment). Else ``inner``.
    """
    if (options.launcher == "local" or options.ray_address is None) and options.script is None:
        return AnnounceBuilds(inner, say)
    return inner
