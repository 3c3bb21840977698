"""What the training code applies beside an exported ds_config, as data: the settings no DeepSpeed key carries
(activation checkpointing, a model setting; the ``dstune`` section: ALST's tiled MLP and loss shards, checkpoint
offload...), which :func:`tuner.space.dsconfig.export_config` leaves out of the config DeepSpeed gets, kept in a file
of their own beside it (pure Python).

A ds_config written to ``lc.json`` gets ``lc.training-code.json`` (:func:`training_code_path`) holding
:func:`training_code`: the values a training script reads (``activation_checkpointing``, ``dstune.tiled_mlp_shards``,
``dstune.tiled_loss_shards``, ``dstune.offload_checkpoints``, ``seq_len``) and ``apply``, the export's notes that
say, with DeepSpeed's names, what to call with them, and ``arctic_training``, the same pieces as ArcticTraining's
config keys (:func:`arctic_training`) for those who train with it (``dstune estimate --max-seq-len`` adds ``again``,
the flags that use the answer again: :mod:`tuner.cli.answer_flags`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.workload import ENV_SECTION, TrialConfig
from tuner.workload.layouts import ULYSSES

SUFFIX = ".training-code.json"
ABOUT = "not DeepSpeed keys: what the training code applies beside {config} (the ds_config DeepSpeed gets)"
ARCTIC_ABOUT = (
    "ArcticTraining's config keys for the same pieces (its deepspeed section: the ds_config); it picks its own MLP "
    "shard count, and tiles the logits and loss itself under Ulysses (sequence_parallel_size > 1) or with "
    "model.type liger"
)


def training_code(trial: TrialConfig, notes: list[str], seq_len: int, config_name: str) -> dict[str, Any]:
    """The code-side settings of ``trial`` at ``seq_len``, with the export's ``notes`` as the steps to apply.

    Example:
        >>> trial = TrialConfig({"dstune": {"tiled_mlp_shards": 4}}, activation_checkpointing=True)
        >>> code = training_code(trial, ["run each MLP through TiledMLP"], 8192, "lc.json")
        >>> code["dstune"], code["activation_checkpointing"], code["apply"]
        ({'tiled_mlp_shards': 4}, True, ['run each MLP through TiledMLP'])
    """
    section = trial.ds_config.get(ENV_SECTION)
    return {
        "about": ABOUT.format(config=config_name),
        "seq_len": seq_len,
        "activation_checkpointing": trial.activation_checkpointing,
        ENV_SECTION: dict(section) if isinstance(section, dict) else {},
        "apply": list(notes),
        "arctic_training": arctic_training(trial, seq_len),
    }


def arctic_training(trial: TrialConfig, seq_len: int) -> dict[str, Any]:
    """The ALST pieces of ``trial`` as ArcticTraining's config keys (its ``projects/sequence-parallelism`` usage:
    ``sequence_parallel_size``, ``activation_checkpoint_cpu_offload``, ``tiled_mlp_compute``, ``data.max_length``).

    >>> keys = arctic_training(TrialConfig({"dstune": {"tiled_mlp_shards": 8, "offload_checkpoints": True}}), 4096)
    >>> keys["activation_checkpoint_cpu_offload"], keys["tiled_mlp_compute"], keys["data"]
    (True, True, {'max_length': 4096})
    """
    context = trial.long_context
    return {
        "about": ARCTIC_ABOUT,
        "sequence_parallel_size": trial.layout.degree(ULYSSES),
        "activation_checkpoint_cpu_offload": context.offload_checkpoints,
        "tiled_mlp_compute": context.tiled_mlp_shards > 1,
        "data": {"max_length": seq_len},
    }


def training_code_path(out: str) -> str:
    """Where the code-side settings of a config written to ``out`` go: beside it, its suffix replaced.

    >>> training_code_path("runs/lc.json"), training_code_path("ds_config")
    ('runs/lc.training-code.json', 'ds_config.training-code.json')
    """
    path = Path(out)
    return str(path.with_name(path.stem + SUFFIX) if path.suffix == ".json" else path.with_name(path.name + SUFFIX))


__all__ = ["SUFFIX", "arctic_training", "training_code", "training_code_path"]
