"""On a GPU: models are born on the device (stages 0-2) or sharded (ZeRO-3), so building adds nothing to the host.

Runs qwen2-1.5b (built-in model, bf16, one rank) at ZeRO-2 and ZeRO-3 and prints, per run, the rank's resident-set
growth while building the model (the old fp32 host build added 4·Ψ = 6.2 GB), after ``deepspeed.initialize``, the
device peak and the estimate. Usage: ``python3 bench/born_on_cuda.py OUT.json [--dry-run]`` (``bench/gpu_validation.sh``
calls it; ``--dry-run``: the tiny LLaMA on one CPU rank at ZeRO-3, the script's path only).
"""

import json
import sys

from tuner.measure.options import MeasureOptions
from tuner.measure.run import measure
from tuner.workload import ClusterSpec, TrainSpec, TrialConfig, Workload, load_builtin_model


def main() -> None:
    dry = "--dry-run" in sys.argv[2:]
    rows = []
    for stage in (3,) if dry else (2, 3):
        cluster = ClusterSpec(gpus_per_node=1, gpu_memory=140 * 2**30, device="cpu" if dry else "cuda")
        work = Workload(
            load_builtin_model("tiny-llama" if dry else "qwen2-1.5b"), cluster, TrainSpec(64 if dry else 512)
        )
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage, **({"reduce_bucket_size": 50_000} if dry else {})},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
            **({} if dry else {"bf16": {"enabled": True}}),
        }
        result = measure(work, TrialConfig(config), MeasureOptions("local", warmup=1, steps=2, timeout=400))
        rank = result["ranks"][0] if result["ranks"] else {}
        rss = rank.get("rss_bytes") or {}
        rows.append(
            {
                "stage": stage,
                "status": result["status"],
                "error": (result["error"] or "")[-400:],
                "host_build_bytes": rss.get("after_model", 0) - rss.get("before_model", 0),
                "host_after_initialize_bytes": rss.get("after_initialize", 0) - rss.get("before_model", 0),
                "peak_allocated": rank.get("peak_allocated"),
                "estimated_total": result["estimate"]["per_gpu"]["total"],
                "device_name": rank.get("device_name"),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    with open(sys.argv[1], "w") as out:
        json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
