"""The short measured run inside one rank's process: ``python -m tuner.measure.rank.runner RUN_DIR RANK``.

A launcher (``tuner.measure.driver.local_launcher`` or ``tuner.measure.driver.ray_launcher``) writes
``RUN_DIR/spec.json`` (a
:class:`~tuner.measure.run_protocol.RunSpec`), sets torchrun's environment (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``), and starts one process per rank. Each
rank trains (:class:`~tuner.measure.rank.training.TrainingProcess`: the model built where it trains, synthetic token
batches, ``deepspeed.initialize``, warm-up steps and timed steps) and writes ``RUN_DIR/rank-N.json`` (a
:class:`tuner.measure.measurement.RankResult`; the files: :mod:`tuner.measure.run_protocol`). A SIGTERM from the
launcher unwinds the rank and leaves no result: the launcher says why it stopped it. The runner knows nothing of
databases or studies."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuner.measure.op_builds import use_environment_builds
from tuner.measure.rank.training import Terminated, TrainingProcess
from tuner.measure.run_protocol import SPAWNED_AT, RunSpec, result_path, write_json_atomically

_terminated: list[int] = []  # the signal, once received: a report written while unwinding from it is not the config's


def _raise_terminated(signum: int, frame: Any) -> None:
    _terminated.append(signum)
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank: run, write the result, exit 0 when ok (143 without a result when terminated)."""
    args = argv or sys.argv[1:]
    run_dir, rank = Path(args[0]), int(args[1])
    signal.signal(signal.SIGTERM, _raise_terminated)
    use_environment_builds()  # DeepSpeed builds or checks its ops where, and with the ninja, every other process does
    try:
        process = TrainingProcess(RunSpec.read(run_dir), rank, run_dir)
        spawned = os.environ.get(SPAWNED_AT)
        if spawned:
            process.result.timings["start_s"] = max(0.0, time.monotonic() - float(spawned))
        result = process.run()
    except Terminated:
        return 128 + signal.SIGTERM
    if _terminated:  # Terminated was swallowed or replaced while unwinding (e.g. mid-import): the launcher classifies
        return 128 + signal.SIGTERM
    write_json_atomically(result_path(run_dir, rank), asdict(result))
    code = 0
    if result.status != "ok":
        print(result.error, file=sys.stderr)
        code = 1
    if process.spec.lean:  # the result is written: skip the interpreter's teardown of torch and DeepSpeed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
