"""The script backend: the user's own training command, run unchanged with the trial's ds_config put where it reads
it, measured by the hook dstune adds to its processes (:mod:`tuner.measure.script`)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from tuner.errors import InputError
from tuner.measure.backends.base import RunControls
from tuner.measure.backends.launchers import launcher_for
from tuner.measure.driver.places import free_port, port_taken
from tuner.measure.driver.shm_buffers import remove_allreduce_buffers
from tuner.measure.measurement import Measurement
from tuner.measure.options import MeasureOptions
from tuner.measure.script import launch
from tuner.measure.script.answer import answer_record
from tuner.measure.script.command import ScriptCommand
from tuner.measure.script.placement import ConfigSlot, batch_targets, find_slot, place, trial_config, user_config
from tuner.measure.script.rank_hook import HOOK_FILE
from tuner.measure.script.readback import read_back
from tuner.measure.script.rendezvous import with_port
from tuner.workload import TrialConfig, Workload, workload_from_dict, workload_to_dict

HOOK_DIR = Path(__file__).resolve().parents[1] / "script" / "hook"
PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the folder holding the tuner package
PORT_ATTEMPTS = 3


class ScriptBackend:
    """Measures a trial by running the user's command (``options.script``) with the trial's ds_config."""

    name: ClassVar[str] = "script"

    def measure(
        self, workload: Workload, trial: TrialConfig, options: MeasureOptions, controls: RunControls
    ) -> Measurement:
        """One run of the command on the launcher ``options`` names; a command whose ds_config cannot be found or
        read raises :class:`InputError` (``ds-config-at``)."""
        script = options.script
        if script is None:
            raise InputError("command", "no training command given")
        slot = find_slot(script)
        world = workload.cluster.world_size
        config = trial_config(user_config(script, slot), trial.deepspeed_config(world))
        args = (script, slot, config, workload_to_dict(workload), options)
        return launcher_for(options).call(run_script, args, world, workload.cluster.device, controls)


def hook_environment(run_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment: this process's (the user's shell) with dstune's hook folder first on
    ``PYTHONPATH`` and the run's folder named. dstune's own settings, never taken from a request."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK_DIR), env.get("PYTHONPATH", "")]))
    env["DSTUNE_SCRIPT_RUN"] = str(run_dir)
    env["DSTUNE_SCRIPT_ROOT"] = str(PACKAGE_ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_script(
    script: ScriptCommand,
    slot: ConfigSlot,
    config: dict[str, Any],
    workload_data: dict[str, Any],
    options: MeasureOptions,
    controls: RunControls | None = None,
) -> Measurement:
    """Run the command once on this machine with ``config`` in place and read back what its ranks measured."""
    controls = controls or RunControls()
    workload = workload_from_dict(workload_data)
    if workload.cluster.device == "cpu":
        _build_counter()
    started = time.monotonic()
    for _attempt in range(PORT_ATTEMPTS):
        measurement, ours = _run_once(script, slot, config, workload, options, controls)
        if not (ours and measurement.status == "error" and port_taken(measurement.error or "")):
            break  # the port dstune chose was taken between its choice and rank 0's bind: another process's luck
    targets = batch_targets(script, slot, user_config(script, slot))
    measurement.script = {**measurement.script, **answer_record(script, slot, targets, config)}
    measurement.set_wall(time.monotonic() - started)
    return measurement


def _run_once(
    script: ScriptCommand,
    slot: ConfigSlot,
    config: dict[str, Any],
    workload: Workload,
    options: MeasureOptions,
    controls: RunControls,
) -> tuple[Measurement, bool]:
    """One start of the command on a free rendezvous port; whether dstune chose that port (the user did not)."""
    with tempfile.TemporaryDirectory(prefix="dstune-script-") as scratch:
        run_dir = Path(scratch)
        settings = {
            "warmup": options.warmup,
            "steps": options.steps,
            "steps_at_least": options.steps_at_least,
            "warmup_max": options.warmup_max,
            "in_call": slot.in_call,  # no ds_config on the command: the rank merges the trial's into its call
        }
        (run_dir / HOOK_FILE).write_text(json.dumps(settings))
        env = hook_environment(run_dir)
        port = free_port()
        meeting = with_port(place(script, slot, config, run_dir), env, port)
        running = launch.start(meeting.argv, script.cwd, {**env, **meeting.env}, run_dir, options.memory_cap)
        try:
            launch.wait(
                running,
                run_dir,
                options.timeout,
                workload.cluster.world_size,
                options.steps,
                controls.progress,
                controls.cancel,
                controls.on_step,
            )
        finally:
            running.stop(None)
            if not meeting.chosen_by_user:
                remove_allreduce_buffers(port)
        ended = (running.killed_for, running.process.returncode)
        measurement = read_back(
            run_dir, workload, *ended, options.timeout, options.seq_len_known, over_memory=running.over_memory
        )
    return measurement, not meeting.chosen_by_user


def _build_counter() -> None:
    """Build the counting allocator once, here, before the ranks load it (two ranks must not build it at once)."""
    from tuner.measure.op_builds import extensions_dir
    from tuner.measure.rank.counting_allocator import build, library_path

    target = library_path(extensions_dir())
    if not target.exists():
        try:
            build(target)
        except Exception:  # no compiler: the ranks report their OS high-water mark only
            return
