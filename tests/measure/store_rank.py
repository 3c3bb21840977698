"""A rank program for the rendezvous port test: rank 0 binds torch's TCPStore on ``MASTER_PORT`` as
``init_process_group`` does, then reports ``ok``; a port taken meanwhile fails it as a real rank 0 fails.

Usage (as a launcher entry): ``python tests/measure/store_rank.py RUN_DIR RANK``."""

import os
import sys
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from tuner.measure.measurement import RankResult
from tuner.measure.run_protocol import result_path, write_json_atomically


def main() -> int:
    run_dir, rank = Path(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), 1, True, timeout=timedelta(seconds=30))
    store.set("bound", os.environ["MASTER_PORT"])
    write_json_atomically(result_path(run_dir, rank), asdict(RankResult(rank, "ok")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
