"""A rank program for placement tests: writes the environment it was started with, then reports ``ok``.

Usage (as a launcher entry): ``python tests/measure/env_rank.py OUT_DIR RUN_DIR RANK``; writes ``OUT_DIR/env-RANK.json``
with the distributed variables and ``CUDA_VISIBLE_DEVICES``, and the rank's result as the runner would. Like a rank
whose DeepSpeed loaded its CPU shm communication op, it leaves a shared-memory segment named as DeepSpeed names it. With
``ENV_RANK_TOGETHER=N`` it first waits until N ranks wrote theirs in the sibling folders of OUT_DIR (concurrent runs).
"""

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tuner.measure.measurement import RankResult
from tuner.measure.run_protocol import result_path, write_json_atomically

BARRIER = "ENV_RANK_TOGETHER"
NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")


def main() -> int:
    out, run_dir, rank = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    seen = {name: os.environ.get(name) for name in (*NAMES, "CUDA_VISIBLE_DEVICES")}
    write_json_atomically(out / f"env-{rank}.json", seen)
    shm = Path("/dev/shm")
    if shm.is_dir():  # DeepSpeed's shm.cpp: deepspeed_allreduce_buffer_{uid}_{addr}_{port}_{rank}, never unlinked
        name = f"deepspeed_allreduce_buffer_{os.getuid()}_{seen['MASTER_ADDR']}_{seen['MASTER_PORT']}_{seen['RANK']}"
        (shm / name).write_bytes(b"\0" * 4096)
    together = int(os.environ.get(BARRIER, "0"))  # concurrent runs: every rank of all waits for the others
    deadline = time.monotonic() + 120
    while len(list(out.parent.glob("*/env-*.json"))) < together and time.monotonic() < deadline:
        time.sleep(0.1)
    write_json_atomically(result_path(run_dir, rank), asdict(RankResult(rank, "ok")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
