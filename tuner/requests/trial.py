"""The trial side of a request: :class:`TrialRequest`, the shortcut fields of a trial config plus a user's
ds_config, as ``dstune estimate|measure`` flags and the API's estimate body give them.

A study searches these; where one config is estimated or measured, the request names it, and
:meth:`TrialRequest.to_trial` makes the one :class:`tuner.workload.TrialConfig` that the estimator, the runner and
the exports read. The API's and the job queue's ``workload`` object also carries the first three fields
(:class:`WorkloadInput`): their JSON stays as clients send it, and the two parts are separated here.

Example:
    >>> TrialRequest(micro_batch=2, stage=3, activation_checkpointing=True,
    ...              ds_config={"gradient_clipping": 0.5}).to_trial("bf16").summary()
    'ZeRO-3 · micro 2 × accum 1 · bf16 · checkpointing'
    >>> trial = TrialRequest(sequence_parallel=2, tiled_loss_shards=4).to_trial("bf16")
    >>> trial.layout.sequence_parallel, trial.long_context.tiled_loss_shards
    (2, 4)
    >>> trial = TrialRequest(stage=3, tensor_parallel=2, hpz_partition_size=4).to_trial("bf16")
    >>> trial.layout.tensor_parallel, trial.layout.hpz_partition_size
    (2, 4)
    >>> TrialRequest(expert_parallel=2).to_trial("bf16").ds_config["expert_parallel"]
    {'enabled': True, 'autoep_size': 2}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from tuner.requests.strict import RequestModel
from tuner.requests.workload import Offload, WorkloadRequest
from tuner.space.dsconfig import merge_configs, shortcut_config
from tuner.workload import TrialConfig, long_context_config, numerics_config
from tuner.workload.layouts import LAYOUTS

MICRO_BATCH = Field(1, ge=1, le=2**16, description="Of the trial config (the ds_config), not the workload.")
GRAD_ACCUM = Field(1, ge=1, le=2**16, description="Of the trial config (the ds_config), not the workload.")
CHECKPOINTING = Field(False, description="Of the trial config (the model's gradient checkpointing), not the workload.")

TILED_MLP = Field(1, ge=1, le=2**20, description="ALST tiled MLP shards (dstune.tiled_mlp_shards).")
TILED_LOSS = Field(1, ge=1, le=2**20, description="ALST tiled logits and loss shards (dstune.tiled_loss_shards).")
BF16_MASTER = Field(
    False,
    description="bf16 master weights and gradients (ds_config bf16.bf16_master_weights_and_grads); "
    "changes the numerics.",
)
BF16_STATES = Field(
    False, description="bf16 optimizer states (ds_config bf16.bf16_optimizer_states); changes the numerics."
)
OPTIMIZER: Any = Field(
    "adamw", description="adamw, or muon (ds_config optimizer.type; ZeRO-1/2; changes the numerics)."
)
CHUNKED_LOSS = Field(False, description="DeepSpeed's chunked cross-entropy loss (dstune.chunked_loss).")
LIGER = Field(
    False, description="Liger-Kernel's fused kernels and loss (dstune.liger_kernel; estimated, not measured)."
)
OFFLOAD_CHECKPOINTS = Field(
    False, description="Checkpointed layer inputs in host memory (dstune.offload_checkpoints; needs checkpointing)."
)


class _ZeroSettings(RequestModel):
    """The ZeRO shortcut fields, the first of :class:`TrialSettings`'."""

    stage: int = Field(0, ge=0, le=3, description="ZeRO stage.")
    offload_optimizer: Offload = "none"
    offload_param: Offload = "none"
    nvme_path: str | None = Field(None, description="Folder for NVMe offload (set on each NVMe offload section).")


def _layout_fields() -> dict[str, Any]:
    """One field per layout of the registry (:data:`tuner.workload.layouts.LAYOUTS`): its degree, 1 (off) by
    default, up to the kind's maximum."""
    return {kind.field: (int, Field(1, ge=1, le=kind.maximum, description=kind.description)) for kind in LAYOUTS}


if TYPE_CHECKING:  # the layout fields are read through the registry's kinds (getattr(settings, kind.field))
    _LayoutSettings = _ZeroSettings
else:
    _LayoutSettings = create_model(
        "_LayoutSettings", __base__=_ZeroSettings, __module__=__name__, __doc__=None, **_layout_fields()
    )


class TrialSettings(_LayoutSettings):
    """A trial config's shortcut fields other than the batch split and checkpointing (which the API's and the job
    queue's ``workload`` object carries: :class:`WorkloadInput`), with ``ds_config``: the API's estimate body takes
    these beside its workload. The ZeRO fields come first, then one degree per layout of the registry."""

    tiled_mlp_shards: int = TILED_MLP
    tiled_loss_shards: int = TILED_LOSS
    offload_checkpoints: bool = OFFLOAD_CHECKPOINTS
    bf16_master_weights: bool = BF16_MASTER
    bf16_optimizer_states: bool = BF16_STATES
    optimizer: Literal["adamw", "muon"] = OPTIMIZER
    chunked_loss: bool = CHUNKED_LOSS
    liger: bool = LIGER
    ds_config: dict[str, Any] | None = Field(None, description="A ds_config merged over the shortcut fields.")

    def layout_config(self) -> dict[str, Any]:
        """The ds_config keys of the layout fields off their defaults (Ulysses and ALST's pieces, AutoTP, AutoEP,
        hpZ).

        >>> TrialSettings(tensor_parallel=2, hpz_partition_size=4).layout_config()
        {'tensor_parallel': {'autotp_size': 2}, 'zero_optimization': {'zero_hpz_partition_size': 4}}
        """
        ulysses, *others = (kind.config(getattr(self, kind.field)) for kind in LAYOUTS)  # tuner.workload.layouts
        alst = long_context_config(1, self.tiled_mlp_shards, self.tiled_loss_shards, self.offload_checkpoints)
        config = merge_configs(ulysses, alst)  # Ulysses' degree, then ALST's pieces, then the other layouts'
        for part in others:
            config = merge_configs(config, part)
        return config

    def with_choices(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config`` with the numerics fields' keys merged over it, then ``ds_config`` (it wins).

        >>> TrialSettings(liger=True, ds_config={"stage3_x": 1}).with_choices({"a": 1})
        {'a': 1, 'dstune': {'liger_kernel': True}, 'stage3_x': 1}
        """
        choices = numerics_config(
            self.bf16_master_weights, self.bf16_optimizer_states, self.optimizer, self.chunked_loss, self.liger
        )
        config = merge_configs(config, choices) if choices else config
        return merge_configs(config, self.ds_config) if self.ds_config is not None else config


class TrialRequest(TrialSettings):
    """One trial config by its shortcut fields, with ``ds_config`` merged over them (it wins)."""

    micro_batch: int = MICRO_BATCH
    grad_accum: int = GRAD_ACCUM
    activation_checkpointing: bool = CHECKPOINTING

    def to_trial(self, precision: str) -> TrialConfig:
        """The trial config: the shortcut fields' ds_config in ``precision`` (the workload's), ``ds_config`` over it."""
        config = shortcut_config(
            self.micro_batch,
            self.grad_accum,
            precision,
            self.stage,
            self.offload_optimizer,
            self.offload_param,
            self.nvme_path,
        )
        config = merge_configs(config, self.layout_config())
        return TrialConfig(self.with_choices(config), self.activation_checkpointing)


class WorkloadInput(WorkloadRequest):
    """The ``workload`` object of an API body or a tuning job: the workload's fields, plus the trial's shortcut
    fields clients have always sent there (an estimate reads them; a recommendation and a study ignore them: they
    are what is searched)."""

    micro_batch: int = MICRO_BATCH
    grad_accum: int = GRAD_ACCUM
    activation_checkpointing: bool = CHECKPOINTING

    @model_validator(mode="before")
    @classmethod
    def _from_workload_request(cls, data: Any) -> Any:
        """A plain :class:`WorkloadRequest` is taken as its fields (the trial's at their defaults)."""
        if isinstance(data, WorkloadRequest) and not isinstance(data, WorkloadInput):
            return data.model_dump(exclude_unset=True)
        return data

    def trial_fields(self) -> dict[str, Any]:
        """The trial's fields this object carries, as :class:`TrialRequest` takes them."""
        return {
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "activation_checkpointing": self.activation_checkpointing,
        }


__all__ = ["TrialRequest", "TrialSettings", "WorkloadInput"]
