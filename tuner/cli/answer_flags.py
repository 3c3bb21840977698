"""The flags that estimate or measure a ``--max-seq-len`` answer again from the ds_config it wrote: that config
holds only DeepSpeed's keys, so the length, checkpointing (a model setting) and the ``dstune`` section's settings
(ALST's tiling, checkpoint offload, the numerics' loss paths) come back as the flags that set them."""

from __future__ import annotations

import shlex

from tuner.workload import ENV_SECTION, TrialConfig

# the dstune section's keys a flag sets: (flag, whether it takes the value)
SECTION_FLAGS = {
    "tiled_mlp_shards": ("--tiled-mlp", True),
    "tiled_loss_shards": ("--tiled-loss", True),
    "offload_checkpoints": ("--offload-checkpoints", False),
    "chunked_loss": ("--chunked-loss", False),
    "liger_kernel": ("--liger", False),
}


def again_flags(trial: TrialConfig, seq_len: int, config_path: str) -> list[str]:
    """``--seq-len``, ``--ds-config`` and the flags of what the config file cannot hold.

    Example:
        >>> trial = TrialConfig({"dstune": {"tiled_mlp_shards": 4, "offload_checkpoints": True}}, True)
        >>> " ".join(again_flags(trial, 8192, "lc.json"))
        '--seq-len 8192 --ds-config lc.json --activation-checkpointing --tiled-mlp 4 --offload-checkpoints'
    """
    flags = ["--seq-len", str(seq_len), "--ds-config", config_path]
    if trial.activation_checkpointing:
        flags.append("--activation-checkpointing")
    section = trial.ds_config.get(ENV_SECTION)
    for key, value in section.items() if isinstance(section, dict) else ():
        flag, valued = SECTION_FLAGS.get(key, ("", False))
        if flag and valued and isinstance(value, int) and value > 1:  # one shard is no tiling
            flags.extend([flag, str(value)])
        elif flag and not valued and value is True:
            flags.append(flag)
    return flags


def again_line(flags: list[str]) -> str:
    """The flags as one shell-quoted line."""
    return shlex.join(flags)


__all__ = ["SECTION_FLAGS", "again_flags", "again_line"]
