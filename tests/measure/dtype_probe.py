"""Build the built-in model the way a rank does, on one gloo rank, and print where its parameters live (JSON).

Usage: ``python tests/measure/dtype_probe.py`` (a fresh process: ``deepspeed.zero.Init`` patches torch globally).
"""

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch

from tuner.measure.driver.places import free_port
from tuner.measure.rank.birth import born_on_device, initialise_partitioned
from tuner.measure.rank.models import build_model, build_transformers_model
from tuner.workload import load_builtin_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests folder, for its shared helpers
from tiny_configs import TINY_CONFIGS


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo")
    spec = load_builtin_model("tiny-llama")
    found = {}
    for stage, precision in ((0, "bf16"), (2, "fp32"), (3, "bf16"), (3, "fp32")):
        config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}}
        if precision == "bf16":
            config["bf16"] = {"enabled": True}
        with born_on_device(config, "cpu"):
            model = build_model(spec)
        held = [getattr(p, "ds_tensor", p) for p in model.parameters()]
        found[f"{stage}-{precision}"] = {
            "dtypes": sorted({str(t.dtype) for t in held}),
            "devices": sorted({t.device.type for t in held}),
            "partitioned": all(hasattr(p, "ds_tensor") for p in model.parameters()),
        }
    # transformers' MoE experts and router are torch.empty until _init_weights, which ZeRO-3's empty partitions skip
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    with born_on_device(config, "cpu", transformers=True):
        moe = build_transformers_model(TINY_CONFIGS["mixtral"])
    initialise_partitioned(moe)
    unset = []
    for name, param in moe.named_parameters():
        with deepspeed.zero.GatheredParameters([param]):
            values = param.data.float()
            if not bool(torch.isfinite(values).all()) or float(values.abs().max()) > 100:
                unset.append(name)
    found["3-bf16-moe-uninitialised"] = unset
    print(json.dumps(found))


if __name__ == "__main__":
    main()
