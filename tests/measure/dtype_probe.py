"""Build the built-in model the way a rank does, on one gloo rank, and print where its parameters live (JSON).

Usage: ``python tests/measure/dtype_probe.py`` (a fresh process: ``deepspeed.zero.Init`` patches torch globally).
"""

import json
import os

import deepspeed

from tuner.measure.birth import born_on_device
from tuner.measure.launcher import free_port
from tuner.measure.models import build_model
from tuner.workload import load_builtin_model


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
    print(json.dumps(found))


if __name__ == "__main__":
    main()
