"""The API's request and response models: the documentation, and through FastAPI the OpenAPI schema (the contract).

Workloads are :class:`tuner.requests.WorkloadInput` (a :class:`tuner.requests.WorkloadRequest` with the trial's
shortcut fields clients send in it) and tuning jobs :class:`tuner.requests.JobRequest`, the same schemas the CLI and
the job queue build workloads and trial configs through.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field, create_model, field_validator
from pydantic_core import PydanticCustomError

from tuner.api.considered import ConsideredLayout
from tuner.forecast import DEFAULT_MARGIN
from tuner.requests import RequestModel, TrialRequest, TrialSettings, WorkloadInput
from tuner.storage import JOB_STATES, JobRecord, StudyRecord, TrialRecord
from tuner.units import parse_fraction
from tuner.workload import MAX_SEQ_LEN  # WorkloadRequest's bound on a given length
from tuner.workload.layouts import ULYSSES


class LongestWorkloadInput(WorkloadInput):
    """The workload of an estimate or a recommendation: ``seq_len`` may be ``"max"``, for the longest sequence that
    fits (``max_seq_len`` in the answer)."""

    seq_len: Annotated[int, Field(ge=1, le=MAX_SEQ_LEN)] | Literal["max"] = Field(  # type: ignore[assignment]
        2048,
        description='Tokens per sample, or "max": the longest length (a multiple of 256, or of what the layout '
        "requires) that fits, searched over ZeRO stage, offloads, activation checkpointing, Ulysses sp and ALST's "
        "tiling and checkpoint offload; the fields given pin what they set.",
    )

    @field_validator("seq_len", mode="before")
    @classmethod
    def _length_or_max(cls, value: Any) -> Any:
        """Out-of-range lengths and words other than "max" refused at ``seq_len`` itself (the union's branches
        would each add their own error and path)."""
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= MAX_SEQ_LEN:
            raise PydanticCustomError("seq_len", f'must be from 1 to {MAX_SEQ_LEN}, or "max"')
        if isinstance(value, str) and value != "max" and not value.strip().isdigit():
            raise PydanticCustomError("seq_len", 'must be a number of tokens or "max"')
        return value


class NextLimitOut(BaseModel):
    """What runs out one step past the longest length."""

    seq_len: int = Field(description="The next length tried, which does not fit.")
    memory: Literal["gpu", "cpu", "cap", "positions", "refused"] = Field(
        description="gpu or cpu: that memory runs out (gpu: or the margin beside the peak, as reason says); cap: the "
        "search stopped at its cap; positions: at the model's learned position table; refused: the estimator "
        "refuses the config there."
    )
    category: str | None = Field(
        description="The category that grows the most from the answer to seq_len (activations, buffers, "
        "parameters...; 'overhead: <term>' for a named CUDA overhead term; a host category for cpu)."
    )
    phase: str | None = Field(description="The peak phase there (gpu).")
    short_by: int = Field(description="Bytes missing there.")
    reason: str


class _LongestConfig(BaseModel):
    """The first fields of :class:`MaxSeqLenOut`: the length and the config that reaches it."""

    seq_len: int = Field(description="Tokens per sample: the longest that fits.")
    multiple: int = Field(description="The granularity searched: lcm(256, sequence_parallel).")
    ds_config: dict[str, Any] = Field(
        description="The config that reaches it (sequence_parallel_size, the dstune section's tiled_mlp_shards, "
        "tiled_loss_shards, offload_checkpoints)."
    )
    activation_checkpointing: bool
    summary: str


if TYPE_CHECKING:  # the Ulysses degree is read through the registry's kind (getattr(answer, ULYSSES.field))
    _LongestLayout = _LongestConfig
else:  # the Ulysses degree, named by the registry (tuner.workload.layouts), in its place among the answer's fields
    _LongestLayout = create_model(
        "_LongestLayout", __base__=_LongestConfig, __module__=__name__, __doc__=None, **{ULYSSES.field: (int, ...)}
    )


class MaxSeqLenOut(_LongestLayout):
    """The longest sequence that fits, the config that reaches it and the next limit (``seq_len: "max"``)."""

    data_parallel: int
    tiled_mlp_shards: int
    tiled_loss_shards: int
    offload_checkpoints: bool
    gpu_total: int = Field(description="Estimated peak bytes per GPU at seq_len.")
    headroom: int
    predicted_tokens_per_s: float | None
    next_limit: NextLimitOut
    max_positions: int = Field(description="The model's max_position_embeddings (0: unknown); not a cap.")
    beyond_max_positions: bool = Field(description="seq_len exceeds max_positions: training needs RoPE scaling.")
    modelled: dict[str, bool | None] = Field(
        description="Whether the estimator's activation and buffer bytes change with sequence_parallel, tiled_mlp, "
        "tiled_loss, offload_checkpoints on this workload (false: not modelled, the answer cannot use it; null: "
        "cannot tell)."
    )
    notes: list[str]
    candidates: int = Field(description="Configs the pins allowed.")
    refused: int = Field(description="Of them, refused by the estimator (not considered).")
    tied: int = Field(description="Configs reaching seq_len; the fastest by predicted throughput, then the simplest.")
    estimates: int = Field(description="Estimates the search made.")
    margin: float = Field(0.0, description="The share of the estimated GPU peak kept free beside it (0: none).")


class EstimateRequest(TrialSettings):
    """A workload and the ds_config to estimate: every trial field ``dstune estimate`` takes (ZeRO stage, offloads,
    the layouts: Ulysses, AutoTP, AutoEP, hpZ, ALST's tiling and checkpoint offload; the micro-batch, accumulation and
    checkpointing in ``workload``), with ``ds_config`` merged over them (it wins), as ``dstune estimate`` does with
    ``--ds-config``. With ``workload.seq_len: "max"``, the longest sequence that fits, the fields given pinning what
    they set, and the estimate of the config that reaches it at that length."""

    workload: LongestWorkloadInput
    margin: float = Field(
        DEFAULT_MARGIN,
        ge=0,
        lt=0.5,
        description='With workload.seq_len "max": the share of the estimated GPU peak the answer keeps free beside it '
        "(0: the estimate's own limit), as dstune estimate --max-seq-len --margin; not with a given length.",
    )

    @field_validator("margin", mode="before")
    @classmethod
    def _percent(cls, value: Any) -> Any:
        """``"10%"`` as 0.1, as ``--margin`` takes it."""
        return parse_fraction(value) if isinstance(value, str) else value

    def trial_request(self) -> TrialRequest:
        """The trial config asked for: this body's trial fields and its workload object's."""
        return TrialRequest(**self.workload.trial_fields(), **self.model_dump(exclude={"workload", "margin"}))


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
        description="Predicted step time and tokens/s (tuner.estimator.predict), with the constants fitted to "
        "measured runs of this hardware and model family when there are any (fit_runs, error), else the table's.",
    )
    max_seq_len: MaxSeqLenOut | None = Field(None, description='The answer for seq_len "max" (else null).')


class RecommendRequest(RequestModel):
    """The workload to recommend for; its micro_batch, grad_accum and activation_checkpointing are ignored (they are
    the trial config, what is recommended). ``seq_len: "max"``: the longest sequence that fits with the calibrated
    margin, and the config that reaches it (source ``estimate``)."""

    workload: LongestWorkloadInput
    global_batch: int | None = Field(
        None,
        ge=1,
        le=2**24,
        description="Samples per optimizer step you train at (train_batch_size; a multiple of the ranks, as for "
        "`dstune tune --global-batch`): every config compared trains it. Null: the recommender picks the micro-batch, "
        "each layout judged at the global batch data parallelism trains at that micro-batch.",
    )


class ConfirmationOut(BaseModel):
    """The winner run once more, independently, after its study (``dstune tune --confirm``): what that run
    measured beside the trial's own figure."""

    trial_number: int = Field(description="The confirmed trial's number in its study.")
    status: str = Field(description="How the confirmation run ended: ok, oom, error...")
    tokens_per_s: float | None = Field(description="The confirmation run's throughput (null unless ok).")
    trial_tokens_per_s: float = Field(description="The trial's own throughput, as the study measured it.")
    ratio: float | None = Field(
        description="The run's speed over the trial's: the trial's median step time over the run's (null unless ok; "
        "a confirmation recorded without step times: tokens_per_s over trial_tokens_per_s)."
    )
    holds: bool = Field(description="True when the run was ok at no less than 0.9x the trial's speed (ratio).")
    line: str = Field(description="The line dstune best prints for it.")
    error: str | None = None
    step_time_p50_s: float | None = Field(None, description="The run's median step time (its slowest rank's).")
    peak_bytes: int | None = None
    wall_s: float | None = None
    steps: int | None = Field(None, description="The timed steps the run measured (more than the trial's).")
    trial_steps: int | None = Field(None, description="The timed steps the trial measured.")
    trial_step_time_p50_s: float | None = Field(None, description="The trial's median step time.")


class RecommendResponse(BaseModel):
    source: Literal["measured", "nearest", "estimate"] = Field(
        description="measured: this workload's best measured trial; nearest: the best measured trial of the same "
        "model on another workload that the estimator says fits this one; estimate: nothing measured, the fitting "
        "config with the best predicted throughput (predicted_tokens_per_s, prediction)."
    )
    ds_config: dict[str, Any] = Field(
        description="The config as dstune best exports it: what DeepSpeed gets (no dstune section, no no-op keys)."
    )
    activation_checkpointing: bool
    tokens_per_s: float | None = Field(description="Measured throughput (on measured_on's workload); null: estimate.")
    peak_bytes: int | None = Field(description="Measured peak per GPU; null for estimate.")
    estimated_peak_bytes: int | None
    trial_id: int | None = Field(
        description="The measured trial's database id (GET /v1/studies/{name}/trials); null: estimate."
    )
    trial_number: int | None = Field(
        None, description="The measured trial's number in its study, from 0, as dstune best and the dashboard show it."
    )
    study: str | None
    global_batch: int = Field(description="Samples per optimizer step of the answer (micro × accumulation × dp).")
    measured_global_batch: int | None = Field(
        None,
        description="Samples per step the trial was measured at (tokens_per_s, peak_bytes); where it differs from "
        "global_batch the answer keeps its micro-batch and accumulates to the asked global batch, re-checked by the "
        "estimator.",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What goes with ds_config, as dstune best prints it (TrainingArguments, Ulysses and ALST's "
        "training code, AutoTP, the peft LoraConfig...).",
    )
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
    considered: list[ConsideredLayout] | None = Field(
        None,
        description="Source estimate: the best config of each layout the default space offers this workload (AutoTP "
        "degrees, hpZ groups), fitting layouts fastest predicted first, then the others closest to fitting first; "
        "null for measured, nearest and seq_len max.",
    )
    why: str | None = Field(
        None,
        description="Source estimate: why the recommended config's layout wins, in one line (its predicted tokens/s "
        "against the next fitting layout's, and which layouts do not fit).",
    )
    max_seq_len: MaxSeqLenOut | None = Field(None, description='The answer for seq_len "max" (else null).')
    numerics: list[str] = Field(
        default_factory=list,
        description="The choices ds_config makes that change the numerics or the loss's code path (bf16 master "
        "weights and gradients, bf16 optimizer states, Muon, the chunked loss, Liger), as dstune best names them; "
        "empty: fp32-master mixed-precision Adam with the model's own loss.",
    )
    changes_numerics: bool = Field(
        False,
        description="True when ds_config trains with other numerics than fp32-master Adam (bf16 master weights, "
        "Muon): chosen by a study allowed to (dstune tune --allow-numerics-changes); notes say which.",
    )
    measured_with: Literal["trainer", "script"] | None = Field(
        None,
        description="Whose figures tokens_per_s and peak_bytes are: trainer, dstune's own trainer; script, the "
        "user's training command (its own model, data and loss); null: nothing measured (source estimate).",
    )
    confirmation: ConfirmationOut | None = Field(
        None, description="The measured trial's independent confirmation run (dstune tune --confirm); null: none."
    )


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
    id: int = Field(description="The trial's database id (/v1/recommend's trial_id); number is the trial's number.")
    study_id: int = Field(description="The study's database id.")
    number: int = Field(description="The trial's number in its study, from 0, as dstune tune, best and the dashboard.")
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
    "ConsideredLayout",
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
