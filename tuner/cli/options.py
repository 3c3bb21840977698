"""The workload flags of ``estimate``, ``measure`` and ``tune``, declared once, and the workload they describe
(plus the few options several commands share: ``--json``, ``--storage``).

:class:`WorkloadFlags` is the declaration: each field's type carries its Typer option (help, bounds, choices from
:mod:`tuner.requests`'s vocabularies) and its default is the flag's default. :func:`workload_options` puts those
options into a command's signature in place of its ``flags: WorkloadFlags`` parameter and hands the command one
:class:`WorkloadFlags`; :func:`build` turns it into the workload, through the same
:class:`tuner.requests.WorkloadRequest` and :func:`tuner.requests.to_workload` as the API and the job queue, plus
the ds_config of the shortcut flags.

Example:
    >>> workload, trial = build(WorkloadFlags(model="tiny-gpt2", gpus=2, stage=2, device="cpu"))
    >>> workload.cluster.world_size, trial.ds_config["zero_optimization"]["stage"]
    (2, 2)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, get_args, get_type_hints

import typer

from tuner.cli.common import default_device, fail
from tuner.cli.numerics_flags import Bf16MasterOpt, Bf16StatesOpt, ChunkedLossOpt, LigerOpt, OptimizerOpt
from tuner.cli.seq_len_option import sequence_length
from tuner.errors import InputError
from tuner.estimator import estimate
from tuner.requests import (
    Attention,
    Device,
    FieldError,
    LauncherEnv,
    Loc,
    ModelImpl,
    Offload,
    Precision,
    TrialRequest,
    WorkloadRequest,
    to_workload,
    trial_workload,
    validated,
)
from tuner.space.dsconfig import load_ds_config
from tuner.workload import GpuTypeName, TrialConfig, Workload, load_hf_config, read_json_object
from tuner.workload.launch_vars import allowed_name, allowed_names
from tuner.workload.layouts import LAYOUTS
from tuner.workload.plain_data import check_plain_data

ModelOpt = Annotated[str | None, typer.Option(help="Hugging Face config.json (or its folder) or a preset.")]
ParamsOpt = Annotated[float | None, typer.Option(help="A bare parameter count, e.g. 7.5e9.")]
GpusOpt = Annotated[int, typer.Option(min=1, help="GPUs per node.")]
NodesOpt = Annotated[int, typer.Option(min=1, help="Number of nodes.")]
GpuMemoryOpt = Annotated[
    str | None,
    typer.Option(
        help="Memory per GPU (80GiB, 512GB or bytes; default: --gpu-type's, else 80GiB; measure and tune on CPU "
        "ranks here: each rank's share of this host's memory)."
    ),
]
GpuTypeOpt = Annotated[
    GpuTypeName | None,
    typer.Option(
        metavar="<gpu type>",  # its choices in the help, which wraps: as a metavar they overran 80 columns
        help=f"GPU type ({', '.join(get_args(GpuTypeName))}): its usable memory, CUDA terms and throughput (measure, "
        "tune: read from the GPU).",
    ),
]
CpuMemoryOpt = Annotated[str, typer.Option(help="CPU memory per node.")]

SeqLenOpt = Annotated[int, typer.Option(parser=sequence_length, metavar="<int range>", help="Sequence length.")]
TuneSeqLenOpt = Annotated[
    str, typer.Option(help="Sequence length, or max: the longest that fits, by measurement from the estimate.")
]
MicroBatchOpt = Annotated[int, typer.Option(min=1, help="Micro-batch per GPU.")]
GradAccumOpt = Annotated[int, typer.Option(min=1, help="Gradient accumulation steps.")]
PrecisionOpt = Annotated[Precision, typer.Option(help="Training precision.")]
StageOpt = Annotated[int, typer.Option(min=0, max=3, help="ZeRO stage.")]
OffloadOptimizerOpt = Annotated[Offload, typer.Option(help="Optimizer offload device.")]
OffloadParamOpt = Annotated[Offload, typer.Option(help="Parameter offload device (ZeRO-3).")]
NvmePathOpt = Annotated[str | None, typer.Option(help="Folder for NVMe offload.")]
CheckpointingOpt = Annotated[bool, typer.Option(help="Recompute activations in backward.")]
AttentionOpt = Annotated[Attention | None, typer.Option(help="Attention kernel (default: transformers' choice).")]
DeviceOpt = Annotated[Device, typer.Option(help="Training device.")]
AutoDeviceOpt = Annotated[Device | None, typer.Option(help="Training device (default: cuda if present).")]
PeftOpt = Annotated[
    str | None, typer.Option(help="peft adapter_config.json (LoRA): only the adapters and modules_to_save train.")
]
FreezeOpt = Annotated[str | None, typer.Option(help="Freeze the parameters whose names match this regex.")]
QuantizationOpt = Annotated[
    str | None,
    typer.Option(
        help="A 4-bit bitsandbytes base (QLoRA): BitsAndBytesConfig JSON (config.json's quantization_config); "
        "needs --peft and --device cuda; estimate only."
    ),
]
# one flag per layout of the registry (tuner.workload.layouts), named by the kind's flag: the degree it pins
_LAYOUT_OPTIONS = {kind.parameter: typer.Option(kind.flag, min=1, help=kind.help) for kind in LAYOUTS}
LAYOUT_FLAGS = tuple(_LAYOUT_OPTIONS)  # their parameter names, in WorkloadFlags.layouts' place
_BY_PARAMETER = {kind.parameter: kind for kind in LAYOUTS}
_TILED_MLP = typer.Option("--tiled-mlp", min=1, help="ALST: each MLP computed in N sequence shards.")
_TILED_LOSS = typer.Option("--tiled-loss", min=1, help="ALST: logits and loss in N shards.")
_OFFLOAD_CHECKPOINTS = typer.Option(help="ALST: checkpointed layer inputs in host memory (needs checkpointing).")
TiledMlpOpt = Annotated[int, _TILED_MLP]
TiledLossOpt = Annotated[int, _TILED_LOSS]
OffloadCheckpointsOpt = Annotated[bool, _OFFLOAD_CHECKPOINTS]
LauncherEnvOpt = Annotated[
    LauncherEnv,
    typer.Option(help="Whose rules give measured ranks their threads (docs/launch_env.md): the launcher you run."),
]
LaunchVarOpt = Annotated[
    list[str] | None,
    typer.Option(help="NAME=VALUE set for every rank over the launcher's rule, e.g. OMP_NUM_THREADS=4 (repeatable)."),
]
BindCoresOpt = Annotated[bool, typer.Option(help="Bind each rank to its share of the cores (--bind_cores_to_rank).")]
DsConfigOpt = Annotated[str | None, typer.Option(help="DeepSpeed config JSON; wins over the flags.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (sizes in bytes).")]
StorageOpt = Annotated[str | None, typer.Option(help="Database URL (default: sqlite:///dstune.db).")]
ModelImplOpt = Annotated[ModelImpl, typer.Option(help="The model trained: transformers from_config, or built-in.")]
WarmupOpt = Annotated[int, typer.Option(min=0, help="Warm-up optimizer steps per measured run (not timed).")]
StepsOpt = Annotated[int, typer.Option(min=1, help="Timed optimizer steps per measured run.")]
WarmupMaxOpt = Annotated[
    int | None,
    typer.Option(min=1, help="Past --warmup, warm up until step times settle, up to this many warm-up steps in all."),
]

# the commands that train default --device to the machine's own (None: cuda if torch sees one)
AUTO_DEVICE: Mapping[str, tuple[Any, Any]] = {"device": (AutoDeviceOpt, None)}
TUNE_FLAGS = (
    "model", "gpus", "nodes", "gpu_memory", "gpu_type", "cpu_memory", "seq_len", "precision", "attention", "device",
    "model_impl", "peft", "freeze", "quantization", *LAYOUT_FLAGS, "tiled_mlp", "tiled_loss", "offload_checkpoints",
    "launcher_env", "launch_var", "bind_cores",
)  # fmt: skip
# tune pins the long-context and layout flags that are given (unset: searched where the space offers them)
TUNE_OVERRIDES: Mapping[str, tuple[Any, Any]] = {
    **AUTO_DEVICE,
    "seq_len": (TuneSeqLenOpt, "2048"),
    **{name: (Annotated[int | None, option], None) for name, option in _LAYOUT_OPTIONS.items()},
    "tiled_mlp": (Annotated[int | None, _TILED_MLP], None),
    "tiled_loss": (Annotated[int | None, _TILED_LOSS], None),
    "offload_checkpoints": (Annotated[bool | None, _OFFLOAD_CHECKPOINTS], None),
}
# the space's parameter each long-context or layout flag pins (search_spaces/default.yaml)
LONG_CONTEXT_PINS = {
    **{kind.parameter: kind.field for kind in LAYOUTS},
    "tiled_mlp": "tiled_mlp_shards",
    "tiled_loss": "tiled_loss_shards",
    "offload_checkpoints": "offload_checkpoints",
}


@dataclass(frozen=True)
class WorkloadFlags:
    """The workload flags as given (``--model`` a path or preset, sizes as text), with their Typer options.

    Besides the :class:`tuner.requests.WorkloadRequest` fields it holds the ds_config shortcuts (``--stage``,
    ``--offload-*``, ``--nvme-path``, ``--ds-config``).
    """

    model: ModelOpt = None
    params: ParamsOpt = None
    gpus: GpusOpt = 1
    nodes: NodesOpt = 1
    gpu_memory: GpuMemoryOpt = None
    gpu_type: GpuTypeOpt = None
    cpu_memory: CpuMemoryOpt = "1TiB"
    seq_len: SeqLenOpt = 2048
    micro_batch: MicroBatchOpt = 1
    grad_accum: GradAccumOpt = 1
    precision: PrecisionOpt = "bf16"
    stage: StageOpt = 0
    offload_optimizer: OffloadOptimizerOpt = "none"
    offload_param: OffloadParamOpt = "none"
    nvme_path: NvmePathOpt = None
    activation_checkpointing: CheckpointingOpt = False
    # the layout flags (one per kind, LAYOUT_FLAGS): each kind's field -> its degree (tune: None where not given)
    layouts: Mapping[str, int | None] = field(default_factory=lambda: {kind.field: 1 for kind in LAYOUTS})
    tiled_mlp: TiledMlpOpt = 1
    tiled_loss: TiledLossOpt = 1
    offload_checkpoints: OffloadCheckpointsOpt = False
    bf16_master_weights: Bf16MasterOpt = False
    bf16_optimizer_states: Bf16StatesOpt = False
    optimizer: OptimizerOpt = "adamw"
    chunked_loss: ChunkedLossOpt = False
    liger: LigerOpt = False
    attention: AttentionOpt = None
    device: DeviceOpt = "cuda"  # None (measure, tune): the machine's own
    ds_config: DsConfigOpt = None
    model_impl: ModelImplOpt = "transformers"
    peft: PeftOpt = None
    freeze: FreezeOpt = None
    quantization: QuantizationOpt = None
    launcher_env: LauncherEnvOpt = "deepspeed"
    launch_var: LaunchVarOpt = None
    bind_cores: BindCoresOpt = False

    def value(self, name: str) -> Any:
        """The value of the flag whose parameter is ``name`` (a layout flag's from :attr:`layouts`)."""
        kind = _BY_PARAMETER.get(name)
        return self.layouts[kind.field] if kind is not None else getattr(self, name)


def workload_options(
    only: Sequence[str] | None = None, overrides: Mapping[str, tuple[Any, Any]] | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the workload flags: its ``flags: WorkloadFlags`` parameter becomes the options (all, or
    ``only`` these, in :class:`WorkloadFlags`' order) at that place in ``--help``; the command is called with
    ``flags=WorkloadFlags(...)``. ``overrides`` maps a field to another ``(annotated type, default)``."""
    declared = _declared()
    unknown = (set(only or ()) | set(overrides or {})) - declared.keys()
    if unknown:
        raise TypeError(f"not workload flags: {', '.join(sorted(unknown))}")
    chosen = {name: (overrides or {}).get(name, spec) for name, spec in declared.items() if not only or name in only}
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)
        for name, (annotation, default) in chosen.items()
    ]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True).parameters.values()
        if "flags" not in {param.name for param in own}:
            raise TypeError(f"{command.__name__} needs a 'flags: WorkloadFlags' parameter")
        parameters: list[inspect.Parameter] = []
        for param in own:
            parameters += options if param.name == "flags" else [param.replace(kind=inspect.Parameter.KEYWORD_ONLY)]

        def with_flags(**values: Any) -> Any:
            given = {name: values.pop(name) for name in chosen}
            layouts = {kind.field: given.pop(kind.parameter, 1) for kind in LAYOUTS}
            return command(flags=WorkloadFlags(**given, layouts=layouts), **values)

        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(with_flags, attribute, getattr(command, attribute))
        with_flags.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        with_flags.__annotations__ = {param.name: param.annotation for param in parameters}
        return with_flags

    return decorate


def _declared() -> dict[str, tuple[Any, Any]]:
    """Each flag's parameter name -> ``(annotated type, default)``, in :class:`WorkloadFlags`' order, the layout
    flags in the place of its ``layouts``."""
    hints = get_type_hints(WorkloadFlags, include_extras=True)
    declared: dict[str, tuple[Any, Any]] = {}
    for item in fields(WorkloadFlags):
        if item.name == "layouts":
            declared |= {name: (Annotated[int, option], 1) for name, option in _LAYOUT_OPTIONS.items()}
        else:
            declared[item.name] = (hints[item.name], item.default)
    return declared


def warmup_limit(warmup: int, warmup_max: int | None) -> int | None:
    """``--warmup-max`` checked against ``--warmup`` (it counts the same steps, so it may not be fewer); bad input:
    one line naming the flag, exit 2."""
    if warmup_max is not None and warmup_max < warmup:
        fail("warmup-max", f"{warmup_max} is fewer than --warmup {warmup}: it caps the warm-up steps in all")
    return warmup_max


def _flag(loc: Loc) -> str:
    """The CLI flag a request path is about: ``gpu_memory`` → ``gpu-memory``, ``config.n_head`` → ``model.n_head``
    (``--model``'s file is sent as ``config``)."""
    head, *rest = (str(part) for part in loc)
    if head == "launch":
        return {"launcher": "launcher-env", "bind_cores": "bind-cores"}.get(rest[0] if rest else "", "launch-var")
    return ".".join(["model" if head == "config" else head.replace("_", "-"), *rest])


def build(flags: WorkloadFlags, lengths: tuple[int, ...] = ()) -> tuple[Workload, TrialConfig]:
    """The workload and the trial config the flags describe (bad input: one line naming the flag, exit 2).

    ``--model`` is read here (a preset, or a ``config.json`` path or folder) and sent as the request's ``config``;
    the trial config is the shortcut flags' (``--micro-batch``, ``--grad-accum``, ``--activation-checkpointing``,
    ``--stage``, ``--offload-*``) with ``--ds-config`` merged over its ds_config (the file wins), checked by the
    estimator. No ``--device`` (measure, tune): cuda when torch sees a GPU, else cpu. ``lengths``: more sequence
    lengths the model's profile holds, traced together with ``--seq-len``'s (:func:`tuner.profile.lengths_profile`).
    """
    try:
        request, name = _request(flags)
        workload = to_workload(request, config_name=name, lengths=lengths)
        workload, trial = _with_trial(flags, workload, lengths)
        estimate(workload, trial)  # validates the config; cheap
    except FieldError as error:
        fail(_flag(error.loc), error.message)
    except InputError as error:
        fail(error.field, error.message)
    return workload, trial


def _request(flags: WorkloadFlags) -> tuple[WorkloadRequest, str | None]:
    """The workload request of the flags (the files they name read here), and the model's display name."""
    if (flags.model is None) == (flags.params is None):
        raise InputError("model", "give exactly one of --model PATH|PRESET or --params COUNT")
    config, name = load_hf_config(flags.model) if flags.model is not None else (None, None)
    peft = read_json_object(flags.peft, "peft", "adapter_config.json") if flags.peft is not None else None
    quantization = read_json_object(flags.quantization, "quantization") if flags.quantization is not None else None
    request = validated(
        WorkloadRequest,
        {
            "config": config,
            "params": flags.params,
            "gpus": flags.gpus,
            "nodes": flags.nodes,
            "gpu_memory": flags.gpu_memory,
            "gpu_type": flags.gpu_type,
            "cpu_memory": flags.cpu_memory,
            "seq_len": flags.seq_len,
            "precision": flags.precision,
            "attention": flags.attention,
            "device": flags.device or default_device(),
            "model_impl": flags.model_impl,
            "peft": peft,
            "freeze": flags.freeze,
            "quantization": quantization,
            "launch": _launch(flags),
        },
    )
    return request, name


def _launch(flags: WorkloadFlags) -> dict[str, Any] | None:
    """The launch environment of ``--launcher-env``, ``--bind-cores`` and ``--launch-var NAME=VALUE``."""
    variables: dict[str, str] = {}
    for item in flags.launch_var or ():
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise InputError("launch-var", f"expected NAME=VALUE, got {item!r}")
        if not allowed_name(name):  # the allow-list of every launch (tuner.workload.launch_vars), and the way around it
            raise InputError(
                "launch-var",
                f"{name!r} is not a variable a launch may set (allowed: {allowed_names()}); a variable of your own "
                "shell reaches the ranks dstune starts on this machine: export it before running dstune",
            )
        variables[name] = value
    if flags.launcher_env == "deepspeed" and not flags.bind_cores and not variables:
        return None
    return {"launcher": flags.launcher_env, "bind_cores": flags.bind_cores, "variables": variables}


def ds_config_file(path: str | None) -> dict[str, Any] | None:
    """The ``--ds-config`` file's object, refused (exit 2) with a non-finite number or a control character."""
    if path is None:
        return None
    override = load_ds_config(path)
    check_plain_data(override, "ds-config")  # NaN, Infinity, 1e400, control characters: exit 2
    return override


def _with_trial(flags: WorkloadFlags, workload: Workload, lengths: tuple[int, ...]) -> tuple[Workload, TrialConfig]:
    """The trial config of the shortcut flags and ``--ds-config``, and the workload carrying the traced activations
    of the precision and checkpointing that config trains with."""
    trial = validated(
        TrialRequest,
        {
            "micro_batch": flags.micro_batch,
            "grad_accum": flags.grad_accum,
            "activation_checkpointing": flags.activation_checkpointing,
            "stage": flags.stage,
            "offload_optimizer": flags.offload_optimizer,
            "offload_param": flags.offload_param,
            "nvme_path": flags.nvme_path,
            **{name: degree or 1 for name, degree in flags.layouts.items()},  # None (tune): searched, not this trial's
            "tiled_mlp_shards": flags.tiled_mlp or 1,
            "tiled_loss_shards": flags.tiled_loss or 1,
            "offload_checkpoints": bool(flags.offload_checkpoints),
            "bf16_master_weights": flags.bf16_master_weights,
            "bf16_optimizer_states": flags.bf16_optimizer_states,
            "optimizer": flags.optimizer,
            "chunked_loss": flags.chunked_loss,
            "liger": flags.liger,
            "ds_config": ds_config_file(flags.ds_config),
        },
    ).to_trial(workload.train.precision)
    # the precision the ds_config trains in (a --ds-config may change it): its traced activations (to_workload
    # attached the workload's own precision's), as the API's estimate traces them
    return trial_workload(workload, trial, lengths), trial


__all__ = [
    "AUTO_DEVICE",
    "LAYOUT_FLAGS",
    "LONG_CONTEXT_PINS",
    "TUNE_FLAGS",
    "TUNE_OVERRIDES",
    "JsonOpt",
    "NvmePathOpt",
    "StepsOpt",
    "StorageOpt",
    "WarmupMaxOpt",
    "WarmupOpt",
    "WorkloadFlags",
    "build",
    "ds_config_file",
    "warmup_limit",
    "workload_options",
]
