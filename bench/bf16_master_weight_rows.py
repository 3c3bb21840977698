"""DeepSpeedExamples' ``training/bf16_master_weight`` rows reproduced with ``dstune estimate``.

The published result (DeepSpeedExamples ``training/bf16_master_weight/README.md``, commit 516082c6): a 6.86B model
on 4 H100s at ZeRO-3, micro-batch 1, seq 512, ``torch.cuda.max_memory_allocated`` per rank ("Peak Memory"), with
activation checkpointing 31.38 GiB with fp32 master weights (``configs/baseline.json``) and 18.93 GiB with bf16
master weights, gradients and optimizer states (``configs/bf16_full.json``), without it 41.28 and 33.20 GiB;
``memory_allocated`` after training 25.74 and 16.17 GiB. The README's "GB" is ``bytes / 1024**3``.

The model is the script's ``SimpleTransformerModel`` (``train.py``): token and learned position embeddings, 32 blocks
of ``nn.MultiheadAttention`` (fused in-projection with bias, out-projection), two LayerNorms and a 4h GELU MLP with
biases, post-norm, and an output projection with bias, with the vocabulary of GPT-2's tokenizer (50,257) the
``--use_real_data`` run uses. It is described here as the same-shaped GPT-2 config
(``bench/configs/bf16_master_weight_7b.json``, untied head): the same parameter tensors but for the head's bias
(50,257 elements of 6.86 billion). The configs are the example's, with its ``train_micro_batch_size_per_gpu: 4``
set to the micro-batch of 1 its runs used (``--batch_size 1``; DeepSpeed's batch check does not see the script's
own data loader). Compared: the estimate's peak before the device overhead terms (CUDA context, NCCL, cuBLAS, the
allocator's reserve, none of which ``max_memory_allocated`` counts) against the published peak.

Run: ``python bench/bf16_master_weight_rows.py``; writes ``bench/results/bf16_master_weight_rows.md``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
MODEL = HERE / "configs" / "bf16_master_weight_7b.json"
BASE = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e7,
        "stage3_param_persistence_threshold": 0,
    },
}
BF16_FULL = {**BASE, "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
# label, config, published peak with checkpointing, without it
ROWS = [("Baseline (fp32 master)", BASE, 31.38, 41.28), ("BF16 master + optimizer states", BF16_FULL, 18.93, 33.20)]
GIB = 2**30


def estimate(config: dict, checkpointing: bool = True) -> dict:
    """``dstune estimate --json`` of the example's workload under ``config``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(config, file)
    command = [
        Path(sys.executable).parent / "dstune", "estimate", "--model", str(MODEL), "--gpus", "4", "--seq-len", "512",
        "--gpu-memory", "80GiB", "--ds-config", file.name, "--json",
    ]  # fmt: skip
    if checkpointing:
        command.append("--activation-checkpointing")
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, check=True, env=os.environ)
    Path(file.name).unlink()
    return json.loads(done.stdout)


def main() -> None:
    lines = [
        "# DeepSpeedExamples' bf16_master_weight rows, reproduced by `dstune estimate`",
        "",
        __doc__.split("\n\n")[1],
        "",
        "| configuration | checkpointing | published peak GiB | estimate before device overhead, GiB | error "
        "| peak phase |",
        "|---|---|---|---|---|---|",
    ]
    for label, config, *peaks in ROWS:
        for checkpointing, peak in zip((True, False), peaks, strict=True):
            est = estimate(config, checkpointing)
            allocated = (est["per_gpu"]["total"] - est["per_gpu"]["overhead"]) / GIB
            row = f"| {label} | {'yes' if checkpointing else 'no'} | {peak:.2f} | {allocated:.2f} |"
            lines.append(f"{row} {allocated / peak - 1:+.1%} | {est['peak_phase']} |")
            print(label, checkpointing, peak, round(allocated, 2), f"{allocated / peak - 1:+.1%}", flush=True)
    (HERE / "results" / "bf16_master_weight_rows.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
