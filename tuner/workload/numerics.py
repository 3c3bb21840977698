"""The ds_config choices that change a training's numerics or its code path: bf16 master weights and gradients,
bf16 optimizer states, the Muon optimizer (read and checked as DeepSpeed 0.19.8 checks them) and DeepSpeed's
chunked cross-entropy (``dstune.chunked_loss``).

* ``bf16.bf16_master_weights_and_grads``: ZeRO 1-3 only (``runtime/config.py``); the ZeRO optimizers keep the
  master partition and its gradient in bf16 (``runtime/base_optimizer.py`` ``_configure_master_weights``). Unless
  ``bf16.bf16_optimizer_states`` is on too, the optimizer states stay fp32 and must live on the host: DeepSpeed
  asserts optimizer offload with ``DeepSpeedCPUAdam`` (``stage_1_and_2.py`` ``_enforce_cpu_offload``,
  ``stage3.py`` ``_enforce_optimizer_offload``); so it does with offload and bf16 optimizer states.
* ``bf16.bf16_optimizer_states``: needs the first (``runtime/config.py``); the moments are then kept in bf16
  (FusedAdam creates them like the bf16 master; with offload DeepSpeed builds ``DeepSpeedCPUAdam`` with
  ``fp32_optimizer_states=False``, ``engine.get_optimizer_configuration``).
* ``optimizer.type: "muon"`` (any case): Muon for the matrices (two or more dimensions, no ``embed`` or ``lm_head``
  in the name: ``deepspeed.set_optimizer_flags``), Adam for the rest (``engine._muon_param_groups``).

* ``dstune.chunked_loss``: the model's loss is DeepSpeed's ``ChunkedCausalLMLoss``
  (``runtime/chunked_cross_entropy.py``, installed on the model with ``install_chunked_causal_lm_loss``): the same
  loss in fp32 without the ``[tokens, vocab]`` fp32 tensors; a code path, not a ds_config key DeepSpeed reads.

* ``dstune.liger_kernel``: the model runs Liger-Kernel's fused RMSNorm, SwiGLU, RoPE and fused linear
  cross-entropy (``liger_kernel.transformers.apply_liger_kernel_to_<model type>``, what HF's ``use_liger_kernel``
  applies): the same maths with other saved tensors and no logits; estimated
  (:mod:`tuner.estimator.activations.liger`), never measured (its kernels need Triton on a GPU, and dstune's runner
  does not apply them).

``data_types.keep_in_fp32_modules`` changes no parameter in 0.19.8: it keeps matching *buffers* in fp32
(``runtime/keep_in_fp32.py``; the engine and ``zero.Init`` cast every parameter to the training dtype), so it is
not a choice here.

Example:
    >>> choices = Numerics.of({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
    ...                                 "bf16_optimizer_states": True}, "zero_optimization": {"stage": 3}})
    >>> choices.changes_numerics, choices.labels()
    (True, ['bf16 master weights and gradients', 'bf16 optimizer states'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.workload.config_values import ConfigError, read_bool, section

MASTER_KEY = "bf16.bf16_master_weights_and_grads"
STATES_KEY = "bf16.bf16_optimizer_states"
MUON = "muon"
LIGER_KEY = "dstune.liger_kernel"


@dataclass(frozen=True, slots=True)
class Numerics:
    """What a ds_config changes in the numerics: bf16 master weights and gradients, bf16 optimizer states, Muon."""

    bf16_master: bool = False
    bf16_optimizer_states: bool = False
    muon: bool = False
    chunked_loss: bool = False
    liger: bool = False

    @classmethod
    def of(cls, ds_config: Mapping[str, Any]) -> Numerics:
        """The choices ``ds_config`` makes, checked as DeepSpeed 0.19.8 checks them (:func:`check_numerics`)."""
        bf16 = section(ds_config, "bf16")
        master = read_bool(bf16, "bf16_master_weights_and_grads", False, "bf16.")
        states = read_bool(bf16, "bf16_optimizer_states", False, "bf16.")
        kind = section(ds_config, "optimizer").get("type", "AdamW")
        chunked = read_bool(section(ds_config, "dstune"), "chunked_loss", False, "dstune.")
        liger = read_bool(section(ds_config, "dstune"), "liger_kernel", False, "dstune.")
        choices = cls(master, states, isinstance(kind, str) and kind.lower() == MUON, chunked, liger)
        check_numerics(choices, ds_config)
        return choices

    @property
    def changes_numerics(self) -> bool:
        """True when training with this config is not the fp32-master mixed-precision Adam reference."""
        return self.bf16_master or self.muon

    @property
    def any(self) -> bool:
        """True when any choice is made: one that changes the numerics, or the loss's or the kernels' code path."""
        return self.changes_numerics or self.chunked_loss or self.liger

    def labels(self) -> list[str]:
        """The choices in words, for summaries and answers."""
        return [
            label
            for on, label in (
                (self.bf16_master, "bf16 master weights and gradients"),
                (self.bf16_optimizer_states, "bf16 optimizer states"),
                (self.muon, "Muon optimizer"),
                (self.chunked_loss, "chunked cross-entropy loss"),
                (self.liger, "Liger kernels"),
            )
            if on
        ]


def check_numerics(choices: Numerics, ds_config: Mapping[str, Any]) -> None:
    """Refuse what DeepSpeed 0.19.8 refuses (``runtime/config.py``, ``base_optimizer._configure_master_weights``),
    naming the key."""
    zero = section(ds_config, "zero_optimization")
    stage = zero.get("stage", 0)
    offload = section(zero, "offload_optimizer").get("device", "none") not in (None, "none")
    if choices.liger and choices.chunked_loss:
        raise ConfigError(LIGER_KEY, "not with dstune.chunked_loss: Liger's fused linear cross-entropy is the loss")
    if choices.bf16_optimizer_states and not choices.bf16_master:
        raise ConfigError(STATES_KEY, f"needs {MASTER_KEY} (DeepSpeed asserts it)")
    if choices.bf16_master:
        if not read_bool(section(ds_config, "bf16"), "enabled", False, "bf16."):
            raise ConfigError(MASTER_KEY, "needs bf16.enabled: the model trains in bf16")
        if stage not in (1, 2, 3):
            raise ConfigError(MASTER_KEY, "needs ZeRO stage 1, 2 or 3 (DeepSpeed asserts it)")
        if (offload or not choices.bf16_optimizer_states) and not _builds_cpu_adam(ds_config, offload):
            need = "optimizer offload" if not choices.bf16_optimizer_states else "DeepSpeedCPUAdam"
            raise ConfigError(
                MASTER_KEY,
                f"needs {need}: DeepSpeed keeps fp32 optimizer states on the host only, through DeepSpeedCPUAdam "
                f"(set {STATES_KEY} to keep them in bf16 on the device, or offload_optimizer to the CPU with Adam)",
            )
    if choices.muon and stage not in (1, 2):
        raise ConfigError("optimizer.type", "Muon is estimated at ZeRO stage 1 or 2 only")


def _builds_cpu_adam(ds_config: Mapping[str, Any], offload: bool) -> bool:
    """Whether DeepSpeed builds ``DeepSpeedCPUAdam``: optimizer offload with Adam or AdamW, not ``torch_adam``."""
    optimizer = section(ds_config, "optimizer")
    kind = optimizer.get("type", "AdamW")
    params = optimizer.get("params") or {}
    torch_adam = isinstance(params, dict) and bool(params.get("torch_adam"))
    return offload and isinstance(kind, str) and kind.lower() in ("adam", "adamw") and not torch_adam


def numerics_notes(choices: Numerics) -> list[str]:
    """What an exported config's user must know: the numerics-changing choices it makes, and how to train with the
    chunked loss (a code change, not a ds_config key).

    >>> numerics_notes(Numerics(bf16_master=True, bf16_optimizer_states=True))
    ['changes the numerics against fp32-master Adam: bf16 master weights and gradients, bf16 optimizer states']
    """
    notes = []
    if choices.changes_numerics:
        changed = [label for label in choices.labels() if label not in ("chunked cross-entropy loss", "Liger kernels")]
        notes.append("changes the numerics against fp32-master Adam: " + ", ".join(changed))
    if choices.chunked_loss:
        notes.append(
            "uses DeepSpeed's chunked cross-entropy: call deepspeed.runtime.chunked_cross_entropy."
            "install_chunked_causal_lm_loss(model) on the transformers model before training"
        )
    if choices.liger:
        notes.append(
            "estimated with Liger-Kernel's kernels: train with use_liger_kernel=True (transformers' Trainer) or "
            "liger_kernel.transformers.apply_liger_kernel_to_<model type>() before the model is built"
        )
    return notes


def numerics_config(
    bf16_master: bool = False,
    bf16_optimizer_states: bool = False,
    optimizer: str = "adamw",
    chunked_loss: bool = False,
    liger: bool = False,
) -> dict[str, Any]:
    """The ds_config sections that make these choices (to merge over a config; empty when none is made).

    >>> numerics_config(True, True, "muon", True)["bf16"]
    {'bf16_master_weights_and_grads': True, 'bf16_optimizer_states': True}
    >>> numerics_config()
    {}
    """
    config: dict[str, Any] = {}
    bf16 = {
        key: True
        for key, on in (
            ("bf16_master_weights_and_grads", bf16_master),
            ("bf16_optimizer_states", bf16_optimizer_states),
        )
        if on
    }
    if bf16:
        config["bf16"] = bf16
    if optimizer.lower() == MUON:
        config["optimizer"] = {"type": "Muon"}
    dstune = {key: True for key, on in (("chunked_loss", chunked_loss), ("liger_kernel", liger)) if on}
    if dstune:
        config["dstune"] = dstune
    return config


__all__ = ["LIGER_KEY", "MASTER_KEY", "STATES_KEY", "Numerics", "check_numerics", "numerics_config", "numerics_notes"]
