"""The API's request and response models: the documentation, and through FastAPI the OpenAPI schema (the contract).

Workloads are :class:`tuner.requests.WorkloadInput` (a :class:`tuner.requests.WorkloadRequest` with the trial's
shortcut fields clients send in it) and tuning jobs :class:`tuner.requests.JobRequest`, the same schemas the CLI and
the job queue build workloads and trial configs through.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from tuner.requests import Offload, RequestModel, WorkloadInput
from tuner.storage import JOB_STATES, JobRecord, StudyRecord, TrialRecord


class EstimateRequest(RequestModel):
    """A workload and the ds_config to estimate: the shortcut fields, with ``ds_config`` merged over them (it wins),
    as ``dstune estimate`` does with ``--ds-config``."""

    workload: WorkloadInput
    stage: int = Field(0, ge=0, le=3)
    offload_optimizer: Offload = "none"
    offload_param: Offload = "none"
    sequence_parallel: int = Field(1, ge=1, le=2**16, description="Ulysses degree (sequence_parallel_size).")
    tiled_mlp_shards: int = Field(1, ge=1, le=2**20, description="ALST tiled MLP shards.")
    tiled_loss_shards: int = Field(1, ge=1, le=2**20, description="ALST tiled logits and loss shards.")
    offload_checkpoints: bool = Field(False, description="Checkpointed layer inputs in host memory.")
    ds_config: dict[str, Any] | None = None


class PhaseBytes(BaseModel):
    gpu: int
    cpu: int


class EstimateResponse(BaseModel):
    """The ``dstune estimate --json`` object: sizes in bytes, per GPU by category (``activations`` null for a bare
    parameter count), per node's CPU, the fit and the phase of the peak."""

    n_params: int
    trainable_params: int = Field(
        description="Parameters that train: n_params for full fine-tuning, fewer with a peft adapter or --freeze "
        "(n_params then counts the model as trained: frozen base, adapters, modules_to_save copies)."
    )
    estimate_only: bool = Field(
        False,
        description="True where no run here can check the estimate: a 4-bit bitsandbytes base (QLoRA) or "
        "zero_quantized_nontrainable_weights (CUDA code): bytes read from the libraries' code, not measured.",
    )
    estimate_only_why: str | None = Field(None, description="Why the estimate is estimate only (null: it is not).")
    architecture: str = Field("", description="transformers' class (MixtralForCausalLM), or the model family.")
    activations_source: str = Field("none", description="trace (the model's traced profile), formula, or none.")
    world_size: int
    per_gpu: dict[str, int | None]
    cpu_per_node: dict[str, int]
    nvme_per_node: int
    gpu_memory: int
    cpu_memory: int
    fits: bool
    headroom: int
    cpu_headroom: int
    peak_phase: str
    phases: dict[str, PhaseBytes]
    details: dict[str, int]
    overhead_terms: dict[str, int] = Field(
        default_factory=dict,
        description="per_gpu.overhead by named term on CUDA (cuda_context, nccl_<group> per communicator, "
        "cublas_workspace, allocator_reserve); empty on CPU.",
    )
    reason: str | None
    ds_config: dict[str, Any] = Field(description="The config that was estimated (shortcut fields + ds_config).")
    throughput: dict[str, Any] | None = Field(
        default=None,
        description="Predicted step time and tokens/s (tuner.estimator.throughput), with the constants fitted to "
        "measured runs of this hardware and model family when there are any (fit_runs, error), else the table's.",
    )


class RecommendRequest(RequestModel):
    """The workload to recommend for; its micro_batch, grad_accum and activation_checkpointing are ignored (they are
    the trial config, what is recommended)."""

    workload: WorkloadInput


class RecommendResponse(BaseModel):
    source: Literal["measured", "nearest", "estimate"] = Field(
        description="measured: this workload's best measured trial; nearest: the best measured trial of the same "
        "model on another workload that the estimator says fits this one; estimate: nothing measured, the fitting "
        "config with the best predicted throughput (predicted_tokens_per_s, prediction)."
    )
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    tokens_per_s: float | None = Field(description="Measured throughput (on measured_on's workload); null: estimate.")
    peak_bytes: int | None = Field(description="Measured peak per GPU; null for estimate.")
    estimated_peak_bytes: int | None
    trial_id: int | None
    study: str | None
    workload_fingerprint: str
    measured_on: str | None = Field(description="Fingerprint of the workload the trial was measured on.")
    margin: float = Field(description="The calibrated safety margin used for the fit check.")
    predicted_tokens_per_s: float | None = Field(default=None, description="The throughput model's prediction.")
    prediction: dict[str, Any] | None = Field(default=None, description="The prediction's terms (source estimate).")
    estimate_only: bool = Field(
        False,
        description="True where no run here can check the estimate: a 4-bit bitsandbytes base (QLoRA) or "
        "zero_quantized_nontrainable_weights (CUDA code): bytes read from the libraries' code, not measured.",
    )
    estimate_only_why: str | None = Field(None, description="Why the estimate is estimate only (null: it is not).")


class StudyOut(BaseModel):
    id: int
    name: str
    sampler: str
    status: str
    objectives: list[Any]
    settings: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, record: StudyRecord) -> StudyOut:
        """The study as the API shows it."""
        return cls.model_validate(record, from_attributes=True)


class TrialOut(BaseModel):
    id: int
    study_id: int
    number: int
    config_key: str
    ds_config: dict[str, Any]
    activation_checkpointing: bool
    params: dict[str, Any] | None
    estimated_peak_bytes: int | None
    status: str
    prune_reason: str | None
    tokens_per_s: float | None
    peak_bytes: int | None
    error: str | None
    attempts: int
    hardware: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float | None

    @classmethod
    def of(cls, record: TrialRecord) -> TrialOut:
        """The trial as the API shows it."""
        return cls.model_validate(record, from_attributes=True)


class StudyDetail(BaseModel):
    study: StudyOut
    workload: dict[str, Any]
    total: int
    counts: dict[str, int]
    pruned_reasons: dict[str, int]
    best: TrialOut | None


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int = Field(description="Trials matching the filter, over all pages.")
    limit: int
    offset: int


class JobOut(BaseModel):
    id: int
    study_name: str
    status: Literal[JOB_STATES]  # type: ignore[valid-type]
    request: dict[str, Any]
    worker: str | None
    progress: dict[str, Any] | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @classmethod
    def of(cls, record: JobRecord) -> JobOut:
        """The job as the API shows it."""
        return cls.model_validate(record, from_attributes=True)


class Health(BaseModel):
    status: Literal["ok", "degraded"] = Field(description="degraded: a recent write failed for want of disk.")
    database: str
    detail: str | None = Field(None, description="Why the server is degraded.")


__all__ = [
    "EstimateRequest",
    "EstimateResponse",
    "Health",
    "JobOut",
    "PhaseBytes",
    "RecommendRequest",
    "RecommendResponse",
    "StudyDetail",
    "StudyOut",
    "TrialOut",
    "TrialPage",
]
