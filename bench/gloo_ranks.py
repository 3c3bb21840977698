"""Start a bench script's own ranks on gloo CPU ranks (one thread each) and collect the report each rank writes.

The script runs itself with ``--rank CASE_JSON --out FOLDER``; rank ``r`` writes ``FOLDER/rank{r}.json``. Shared by
``bench/sp_true_peak.py`` and ``bench/tp_true_peak.py`` (imported by name: a script's own folder is on its path).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuner.measure.op_builds import environment_ninja_path


def run_ranks(script: str, case: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``script``'s ranks for ``case`` (``case["world"]`` of them): status, wall seconds, each rank's report
    (None for a rank that wrote none) and, when one is missing, the tail of rank 0's output."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        procs = []
        for rank in range(case["world"]):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(case["world"]),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                PATH=environment_ninja_path(os.environ.get("PATH", os.defpath)),  # the ninja the runs build with
            )
            command = [sys.executable, script, "--rank", json.dumps(case), "--out", scratch]
            procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        outputs = [proc.communicate(timeout=timeout)[0].decode(errors="replace") for proc in procs]
        ranks = []
        for rank in range(case["world"]):
            path = Path(scratch) / f"rank{rank}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else None)
    status = "ok" if all(ranks) else "error"
    return {
        "status": status,
        "wall_s": time.monotonic() - started,
        "ranks": ranks,
        "error": "" if status == "ok" else outputs[0][-3000:],
    }
