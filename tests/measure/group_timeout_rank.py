"""One gloo rank joins its process group as a measured rank does, makes DeepSpeed's groups, prints their timeouts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tuner.measure.rank.training import TrainingProcess
from tuner.measure.run_protocol import RunSpec
from tuner.workload import ClusterSpec, TrainSpec, Workload, workload_to_dict
from tuner.workload.model import model_from_param_count


def main() -> None:
    import deepspeed.comm as dist
    from deepspeed.utils import groups
    from torch.distributed import distributed_c10d

    workload = Workload(model_from_param_count(1e6), ClusterSpec(gpus_per_node=1, device="cpu"), TrainSpec(seq_len=8))
    spec = RunSpec(workload_to_dict(workload), {"train_micro_batch_size_per_gpu": 1}, device="cpu")
    spec.collective_timeout_s = 42.0
    TrainingProcess(spec, 0, Path(sys.argv[1]))._join_process_group(cuda=False)
    groups._clone_world_group()  # ZeRO's data-parallel group without an mpu
    dist.new_group([0])  # how DeepSpeed makes its SP / TP / EP / hpZ groups
    cpu = torch.device("cpu")
    seconds = [group._get_backend(cpu).options._timeout.total_seconds() for group in distributed_c10d._world.pg_map]
    print(json.dumps(seconds))


if __name__ == "__main__":
    main()
