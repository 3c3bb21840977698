"""Which DeepSpeed ops a run builds first: by device and config, against a temporary extensions folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.measure.op_builds import (
    AnnounceBuilds,
    announced,
    build_notice,
    build_ops,
    environment_name,
    environment_ninja_path,
    extensions_dir,
    installed_versions,
    missing_ops,
    ops_needed,
)
from tuner.measure.options import MeasureOptions
from tuner.measure.script.command import ScriptCommand

ADAMW = {"type": "AdamW", "params": {"lr": 1e-4}}
OFFLOAD = {"stage": 2, "offload_optimizer": {"device": "cpu"}}


@pytest.mark.parametrize(
    ("device", "config", "ops"),
    [
        ("cpu", {"optimizer": ADAMW}, ["deepspeed_shm_comm", "fused_adam"]),
        ("cpu", {"optimizer": ADAMW, "zero_optimization": OFFLOAD}, ["deepspeed_shm_comm", "cpu_adam"]),
        (
            "cpu",
            {"optimizer": {"type": "Adam"}, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
            ["deepspeed_shm_comm", "cpu_adam"],
        ),
        ("cpu", {"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, ["deepspeed_shm_comm"]),
        ("cpu", {"zero_optimization": {"stage": 1}}, ["deepspeed_shm_comm"]),  # no optimizer in the config
        ("cuda", {"optimizer": ADAMW}, ["fused_adam"]),
        ("cuda", {"optimizer": ADAMW, "zero_optimization": {"offload_optimizer": {"device": "none"}}}, ["fused_adam"]),
    ],
)
def test_ops_needed(device: str, config: dict, ops: list[str]) -> None:
    assert ops_needed(device, config) == ops


def test_extensions_dir_follows_torch_with_a_folder_per_environment(tmp_path: Path) -> None:
    """Torch's default folder is shared by every virtualenv of a user, and two environments' builds invalidate each
    other's (README command 1 took 24 minutes beside a second dstune virtualenv): without ``TORCH_EXTENSIONS_DIR``
    each environment builds in a folder of its own below it."""
    assert extensions_dir({"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == tmp_path
    python = f"py{sys.version_info.major}{sys.version_info.minor}{sys.abiflags}"
    default = tmp_path / ".cache" / "torch_extensions" / f"{python}_cpu"
    one, other = (extensions_dir({"HOME": str(tmp_path)}, "cpu", str(tmp_path / name / ".venv")) for name in "ab")
    assert one.parent == other.parent == default and one != other and one.name.startswith("dstune-.venv-")
    assert extensions_dir({"XDG_CACHE_HOME": str(tmp_path)}, "cu128").parent == tmp_path / "torch_extensions" / (
        f"{python}_cu128"
    )


def test_an_upgrade_of_torch_or_deepspeed_builds_in_a_folder_of_its_own() -> None:
    """The build line ("once; later runs reuse them") is true after an upgrade too: the upgraded environment's ops are
    missing from its new folder, so the line is printed, instead of a silent rebuild in the old folder."""
    old, new = "torch 2.13.0, deepspeed 0.19.8", "torch 2.13.0, deepspeed 0.19.9"
    assert environment_name("/opt/a/.venv", old) == environment_name("/opt/a/.venv", old)
    assert environment_name("/opt/a/.venv", old) != environment_name("/opt/a/.venv", new)
    assert environment_name("/opt/a/.venv", old) != environment_name("/opt/b/.venv", old)
    assert environment_name("/opt/a/.venv") == environment_name("/opt/a/.venv", installed_versions())
    assert installed_versions().startswith("torch 2.") and ", deepspeed 0." in installed_versions()


def test_a_command_that_measures_builds_in_its_environments_folder(tmp_path: Path) -> None:
    """What every rank, fork server and local Ray worker of ``dstune measure|tune|worker`` inherits; a folder given
    is kept."""
    code = (
        "from tuner.measure.op_builds import use_environment_builds as use; use(); import os; "
        "print(os.environ['TORCH_EXTENSIONS_DIR'])"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"} | {"HOME": str(tmp_path)}
    env.pop("XDG_CACHE_HOME", None)
    found = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert Path(found.strip()) == extensions_dir(env) and Path(found.strip()).parent.name.startswith("py")
    given = subprocess.run([sys.executable, "-c", code], env={**env, "TORCH_EXTENSIONS_DIR": str(tmp_path)},
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert given.strip() == str(tmp_path)


def built(root: Path, op: str) -> None:
    (root / op).mkdir(parents=True)
    (root / op / f"{op}.so").write_bytes(b"\x7fELF")


def test_missing_ops_looks_for_each_built_library(tmp_path: Path) -> None:
    built(tmp_path, "deepspeed_shm_comm")
    (tmp_path / "fused_adam").mkdir()  # a build that never finished: no library yet
    (tmp_path / "fused_adam" / "lock").touch()
    ops = ["deepspeed_shm_comm", "fused_adam", "cpu_adam", "fused_adam"]
    assert missing_ops(ops, tmp_path) == ["fused_adam", "cpu_adam"]
    assert missing_ops(ops, tmp_path, prebuilt={"cpu_adam"}) == ["fused_adam"]


def test_build_notice_names_what_is_missing_and_where(tmp_path: Path) -> None:
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    configs = [{"optimizer": ADAMW}, {"optimizer": ADAMW, "zero_optimization": OFFLOAD}]
    notice, ops = build_notice("cpu", configs, env=env, prebuilt=())
    assert ops == ["deepspeed_shm_comm", "fused_adam", "cpu_adam"]
    assert notice == (
        f"Building DeepSpeed's CPU ops (deepspeed_shm_comm, fused_adam, cpu_adam) once; later runs reuse them from "
        f"{tmp_path}"
    )
    built(tmp_path, "deepspeed_shm_comm")
    built(tmp_path, "fused_adam")
    assert build_notice("cpu", configs[:1], env=env, prebuilt=()) == (None, [])
    assert build_notice("cpu", configs, env=env, prebuilt=(), skip={"cpu_adam"}) == (None, [])
    assert build_notice("cpu", configs, env=env, prebuilt=())[1] == ["cpu_adam"]
    assert build_notice("cuda", configs, env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "new")}, prebuilt=())[
        0
    ].startswith("Building DeepSpeed's ops (fused_adam, cpu_adam) once")


def test_the_interpreters_ninja_comes_first_whatever_path_a_process_starts_with(tmp_path: Path) -> None:
    """Two ninjas hash a build's command differently and redo each other's builds: every process must find one."""
    scripts = tmp_path / "venv-bin"
    scripts.mkdir()
    plain = "/usr/local/bin:/usr/bin:/bin"
    assert environment_ninja_path(plain, bin_dir=str(scripts)) == plain  # no ninja of its own: PATH as it was
    (scripts / "ninja").write_text("#!/bin/sh\n")
    first = environment_ninja_path(plain, bin_dir=str(scripts))
    activated = environment_ninja_path(f"{scripts}:{plain}", bin_dir=str(scripts))
    trailing = environment_ninja_path(f"{plain}:{scripts}", bin_dir=str(scripts))
    assert first == activated == trailing == f"{scripts}:{plain}"


def test_the_suites_processes_find_the_ninja_the_runs_use() -> None:
    """The processes the tests start build and check DeepSpeed's ops with the ninja the product's runs put first
    (tests/conftest.py): with another first, each op was rebuilt whenever the two kinds of process took turns."""
    scripts = os.path.dirname(sys.executable)
    if os.path.isfile(os.path.join(scripts, "ninja")):
        assert shutil.which("ninja") == os.path.join(scripts, "ninja")


@pytest.mark.deepspeed
def test_an_op_built_once_is_reused_by_the_next_build() -> None:
    """What a study or ``measure`` does before the run that needs an op (outside the run's timeout), twice: the second
    time torch's build finds the library up to date and links nothing (ninja's log has no new link of it, the library
    is the same file). In the suite's folder, where ``tests/run.sh`` built the op before the tests."""
    root = extensions_dir()
    assert build_ops(["deepspeed_shm_comm"])
    library = root / "deepspeed_shm_comm" / "deepspeed_shm_comm.so"
    links, written = links_of(root, "deepspeed_shm_comm"), library.stat().st_mtime_ns
    assert build_ops(["deepspeed_shm_comm"]) and build_ops([])
    assert links_of(root, "deepspeed_shm_comm") == links and library.stat().st_mtime_ns == written


def links_of(root: Path, op: str) -> int:
    """How many times ninja linked ``op``'s library in ``root`` (its build log's lines for ``<op>.so``)."""
    lines = (root / op / ".ninja_log").read_text().splitlines()[1:]
    return sum(line.split("\t")[3:4] == [f"{op}.so"] for line in lines)


class Dispatcher:
    """Stands for a study's dispatcher: what ``announced`` wraps or leaves alone."""

    slots = 1

    def submit(self, workload: object, trial: object, on_step: object = None) -> None:
        raise AssertionError("nothing is run here")

    def cancel(self) -> None:
        pass


def test_builds_are_announced_and_made_first_where_the_ranks_run_here() -> None:
    """tune, the length search and the worker wrap their dispatcher alike: the local launcher or a private local Ray
    builds here; a Ray cluster's nodes and a training command build in their own environments."""
    inner = Dispatcher()
    assert isinstance(announced(inner, MeasureOptions("local"), print), AnnounceBuilds)
    assert isinstance(announced(inner, MeasureOptions("ray"), print), AnnounceBuilds)
    assert announced(inner, MeasureOptions("ray", "head:6379"), print) is inner
    assert isinstance(announced(inner, MeasureOptions("local", "head:6379"), print), AnnounceBuilds)
    script = MeasureOptions("local", script=ScriptCommand(("python", "train.py"), "."))
    assert announced(inner, script, print) is inner
