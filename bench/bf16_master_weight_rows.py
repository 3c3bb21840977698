"""DeepSpeedExamples' ``training/bf16_master_weight`` rows reproduced with ``dstune estimate``.

The published result (DeepSpeedExamples ``training/bf16_master_weight/README.md``, commit 516082c6): a 6.86B model
on 4 H100s at ZeRO-3, micro-batch 1, seq 512, ``torch.cuda.max_memory_allocated`` per rank ("Peak Memory"), with
activation checkpointing 31.38 GiB with fp32 master weights (``configs/baseline.json``) and 18.93 GiB with bf16
master weights, gradients and optimizer states (``configs/bf16_full.json``), without it 41.28 and 33.20 GiB;
``memory_allocated`` after training 25.74 and 16.17 GiB. The README's "GB" is ``bytes / 1024**3``.

The model is the script's own ``SimpleTransformerModel`` (``train.py``) as dstune's built-in
``nn.MultiheadAttention`` transformer (``bench/configs/bf16_master_weight_mha_7b.json``, ``model_type:
"mha_transformer"``, :mod:`tuner.profile.mha_transformer`): token and learned position embeddings, 32 blocks of
``nn.MultiheadAttention`` called with its default ``need_weights=True``, post-norm LayerNorms and a 4h GELU MLP, an
output projection with bias, with the vocabulary of GPT-2's tokenizer (50,257) the ``--use_real_data`` run uses,
traced (what it saves for backward counted from the module itself), under ``torch_autocast`` with CUDA's autocast
policy for ``bf16_full.json`` (:mod:`tuner.profile.autocast_trace`). The configs are the example's, with its
``train_micro_batch_size_per_gpu: 4`` set to the micro-batch of 1 its runs used (``--batch_size 1``; DeepSpeed's
batch check does not see the script's own data loader), and ``zero_optimization.memory_efficient_linear: false``:
the script builds its model outside ``deepspeed.zero.Init`` and hands it to ``deepspeed.initialize``, so its Linears
run torch's own ``F.linear``, whose saved ``weight.t()`` views keep every gathered weight from forward to backward
(:mod:`tuner.estimator.states.saved_weights`); the key says the same to dstune. Compared: the estimate's peak before the
device overhead terms (CUDA context, NCCL, cuBLAS, the allocator's reserve, none of which ``max_memory_allocated``
counts) against the published peak. The last columns are this bench's figures with the GPT-2 stand-in it used
before (a GPT-2 config of the same parameter shapes, traced as Hugging Face's GPT-2, without the held weights).
The script's model alone saves less than that GPT-2 (2.68 and 3.98 GiB of activations without checkpointing, against
5.98): without the held Linear weights (12.38 GiB per rank, ``saved_weight_views``) its estimates were 30.37 and
22.09 GiB (-26.4 % and -33.5 %); the published no-checkpointing peaks are 9.9 and 14.3 GiB above the checkpointed ones.

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
MODEL = HERE / "configs" / "bf16_master_weight_mha_7b.json"
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
        "memory_efficient_linear": False,  # the script's model is built outside zero.Init (module docstring)
    },
    "torch_autocast": {"enabled": False},
}
BF16_FULL = {
    **BASE,
    "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
    "torch_autocast": {"enabled": True, "dtype": "torch.bfloat16"},
}
# label, config, published peak with checkpointing, without it, the GPT-2 stand-in's estimates (with, without)
ROWS = [
    ("Baseline (fp32 master)", BASE, (31.38, 41.28), (29.37, 33.68)),
    ("BF16 master + optimizer states", BF16_FULL, (18.93, 33.20), (18.35, 24.10)),
]
SMALL = HERE / "configs" / "bf16_master_weight_mha_254m.json"  # train.py's defaults: 254M parameters
# the README's 254M rows (train.py's defaults: batch 4, no checkpointing, vocabulary 50,000): label, config, GPUs, peak
SMALL_ROWS = [
    ("Baseline (fp32 master)", BASE, 1, 5.93),
    ("BF16 master + optimizer states", BF16_FULL, 1, 5.73),
    ("Baseline (fp32 master)", BASE, 4, 3.57),
    ("BF16 master + optimizer states", BF16_FULL, 4, 4.44),
]
GIB = 2**30


def estimate(config: dict, checkpointing: bool = True, model: Path = MODEL, gpus: int = 4) -> dict:
    """``dstune estimate --json`` of the example's workload (``model`` on ``gpus``) under ``config``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
        json.dump(config, file)
    command = [
        Path(sys.executable).parent / "dstune", "estimate", "--model", str(model), "--gpus", str(gpus), "--seq-len",
        "512", "--gpu-memory", "80GiB", "--ds-config", file.name, "--json",
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
        __doc__.split("\n\n")[2],
        "",
        "| configuration | checkpointing | published peak GiB | estimate before device overhead, GiB | error "
        "| peak phase | GPT-2 stand-in's estimate, GiB | its error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, config, peaks, before in ROWS:
        for checkpointing, peak, old in zip((True, False), peaks, before, strict=True):
            est = estimate(config, checkpointing)
            allocated = (est["per_gpu"]["total"] - est["per_gpu"]["overhead"]) / GIB
            row = f"| {label} | {'yes' if checkpointing else 'no'} | {peak:.2f} | {allocated:.2f} |"
            row += f" {allocated / peak - 1:+.1%} | {est['peak_phase']} | {old:.2f} | {old / peak - 1:+.1%} |"
            lines.append(row)
            print(label, checkpointing, peak, round(allocated, 2), f"{allocated / peak - 1:+.1%}", flush=True)
    lines += ["", *small_rows()]
    (HERE / "results" / "bf16_master_weight_rows.md").write_text("\n".join(lines) + "\n")


def small_rows() -> list[str]:
    """The README's 254M rows (1 and 4 GPUs, per GPU), the same configs at micro-batch 4."""
    lines = [
        "The README's 254M-parameter rows (``train.py``'s defaults: hidden 1024, 12 layers, 16 heads, vocabulary "
        "50,000, batch 4, seq 512, no checkpointing; ``bench/configs/bf16_master_weight_mha_254m.json``):",
        "",
        "| configuration | GPUs | published peak GiB | estimate before device overhead, GiB | error | peak phase |",
        "|---|---|---|---|---|---|",
    ]
    for label, config, gpus, peak in SMALL_ROWS:
        est = estimate({**config, "train_micro_batch_size_per_gpu": 4}, False, SMALL, gpus)
        allocated = (est["per_gpu"]["total"] - est["per_gpu"]["overhead"]) / GIB
        lines.append(
            f"| {label} | {gpus} | {peak:.2f} | {allocated:.2f} | {allocated / peak - 1:+.1%} | {est['peak_phase']} |"
        )
        print(label, gpus, peak, round(allocated, 2), f"{allocated / peak - 1:+.1%}", flush=True)
    return lines


if __name__ == "__main__":
    main()
