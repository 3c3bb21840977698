"""The flags of ``dstune estimate`` and ``measure`` that make numerics-changing choices for the one config they
estimate or train (:class:`tuner.workload.Numerics`): bf16 master weights and optimizer states, Muon, DeepSpeed's
chunked loss, Liger's kernels (estimated only). ``tune`` searches the first four with ``--allow-numerics-changes``."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

Bf16MasterOpt = Annotated[
    bool,
    typer.Option(
        "--bf16-master-weights",
        help="bf16 master weights and gradients (bf16.bf16_master_weights_and_grads; ZeRO 1-3; changes numerics).",
    ),
]
Bf16StatesOpt = Annotated[
    bool,
    typer.Option(
        "--bf16-optimizer-states",
        help="bf16 optimizer states (bf16.bf16_optimizer_states; needs --bf16-master-weights; changes numerics).",
    ),
]
OptimizerOpt = Annotated[
    Literal["adamw", "muon"],
    typer.Option(help="The optimizer: adamw, or muon (Muon for matrices, Adam for the rest; ZeRO-1/2; numerics)."),
]
ChunkedLossOpt = Annotated[
    bool,
    typer.Option(
        "--chunked-loss", help="DeepSpeed's chunked cross-entropy instead of Hugging Face's (no fp32 logits copies)."
    ),
]

LigerOpt = Annotated[
    bool,
    typer.Option(
        "--liger",
        help="Liger-Kernel's fused RMSNorm, SwiGLU, RoPE and linear cross-entropy (HF's use_liger_kernel; estimate).",
    ),
]

__all__ = ["Bf16MasterOpt", "Bf16StatesOpt", "ChunkedLossOpt", "LigerOpt", "OptimizerOpt"]
