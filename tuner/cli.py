"""The ``dstune`` command line: a thin face over the workload, the ds_config helpers and the estimator.

Every bad input ends the same way: one line ``error: <field>: <message>`` on stderr, exit code 2 (DESIGN.md).
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from tuner.dsconfig import load_ds_config, merge_configs, shortcut_config
from tuner.estimator import ConfigError, MemoryEstimate, estimate, resolve
from tuner.profile import load_model, with_profile
from tuner.units import GiB, parse_bytes, parse_duration
from tuner.workload import (
    ClusterSpec,
    ModelSpec,
    TrainSpec,
    Workload,
    WorkloadError,
    load_hf_config,
    model_from_param_count,
)

USAGE_EXIT = 2
Precision = Literal["bf16", "fp16", "fp32"]
Offload = Literal["none", "cpu", "nvme"]
Attention = Literal["sdpa", "flash", "eager"]
Device = Literal["cuda", "cpu"]
Launcher = Literal["local", "ray"]
Sampler = Literal["tpe", "random", "grid", "gp"]
ExportFormat = Literal["deepspeed", "hf"]
ModelImpl = Literal["builtin", "transformers"]
ROWS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_states", "optimizer states"),
    ("activations", "activations"),
    ("buffers", "buffers"),
    ("overhead", "overhead"),
    ("total", "total"),
)


# Typer >= 0.25 vendors click; take its exception classes from the public BadParameter to work with either.
UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _print_error(field_name: str, message: str) -> None:
    """Print the one-line ``error: <field>: <message>`` to stderr."""
    typer.echo(f"error: {field_name}: {_one_line(message)}", err=True)


def _click_field(error: Exception) -> str:
    """The option a click error is about, without dashes (``stage`` for ``--stage``)."""
    param = getattr(error, "param", None)
    if param is not None:
        names = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")] or [param.name or "argument"]
        return names[0].lstrip("-")
    option_name = getattr(error, "option_name", None)
    if option_name:
        return option_name.lstrip("-")
    return "usage"


def _click_message(error: Exception) -> str:
    """A click error's message without the ``Invalid value for '--x':`` preamble (the field says it)."""
    if isinstance(error, typer.BadParameter) and error.param is not None and error.message:
        return error.message.removeprefix("Value error, ")
    return error.format_message()  # type: ignore[attr-defined]


class OneLineErrorGroup(TyperGroup):
    """A Typer group that reports usage errors as one ``error: <field>: <message>`` line, not a panel."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        """Run the command; in standalone mode turn click's errors into one line and exit."""
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except ClickException as error:
            message = _click_message(error)
            if message:  # empty for a bare ``dstune``: the help was shown already
                _print_error(_click_field(error), message)
            sys.exit(USAGE_EXIT if isinstance(error, UsageError) else getattr(error, "exit_code", 1))
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


app = typer.Typer(
    cls=OneLineErrorGroup,
    help="Auto-tuning search for DeepSpeed training configurations.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _fail(field_name: str, message: str) -> NoReturn:
    """Report bad input on one line and exit with code 2."""
    _print_error(field_name, message)
    raise typer.Exit(USAGE_EXIT)


def _version_callback(value: bool) -> None:
    if value:
        try:
            typer.echo(version("dstune"))
        except PackageNotFoundError:
            typer.echo("unknown")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Auto-tuning search for DeepSpeed training configurations."""


def _size(text: str, field_name: str) -> int:
    """Parse a memory size option (``80GiB``, ``512GB`` or bytes)."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise WorkloadError(field_name, str(error)) from None


def _model(model: str | None, params: float | None, model_impl: str = "transformers") -> ModelSpec:
    """The model from exactly one of ``--model`` and ``--params``."""
    if (model is None) == (params is None):
        raise WorkloadError("model", "give exactly one of --model PATH|PRESET or --params COUNT")
    if model is not None:
        return load_model(model, implementation=model_impl)
    if params is None or not math.isfinite(params):
        raise WorkloadError("params", f"must be a finite positive number of parameters, got {params!r}")
    return model_from_param_count(params)


def _ds_config(
    train: TrainSpec,
    stage: int,
    offload_optimizer: str,
    offload_param: str,
    nvme_path: str | None,
    ds_config: str | None,
) -> dict[str, Any]:
    """The shortcut flags' config, with the ``--ds-config`` file merged over it (the file wins)."""
    config = shortcut_config(
        train.micro_batch,
        train.grad_accum,
        train.precision,
        stage,
        offload_optimizer,
        offload_param,
        nvme_path,
    )
    if ds_config is not None:
        config = merge_configs(config, load_ds_config(ds_config))
    return config


def _gib(size: int | None) -> str:
    return "unknown" if size is None else f"{size / GiB:.2f}"


def render(est: MemoryEstimate, title: str, console: Console | None = None) -> None:
    """Print an estimate as a table of per-GPU categories in GiB, the CPU total, peak phase and verdict."""
    console = console or Console()
    console.print(title, highlight=False)
    table = Table()
    table.add_column("per GPU")
    table.add_column("GiB", justify="right")
    for key, label in ROWS:
        table.add_row(label, _gib(est.per_gpu.get(key)), style="bold" if key == "total" else None)
    console.print(table)
    console.print(f"CPU per node: {_gib(est.cpu_per_node['total'])} GiB of {_gib(est.cpu_memory)} GiB")
    console.print(f"peak phase: {est.peak_phase}")
    if est.fits:
        console.print(
            f"[green]FITS[/green] with {_gib(est.headroom)} GiB headroom per GPU (of {_gib(est.gpu_memory)} GiB)"
        )
    else:
        console.print(f"[red]DOES NOT FIT[/red]: {est.overflow_reason()}", highlight=False, soft_wrap=True)


ModelOpt = Annotated[str | None, typer.Option(help="Hugging Face config.json (or its folder) or a preset.")]
ParamsOpt = Annotated[float | None, typer.Option(help="A bare parameter count, e.g. 7.5e9.")]
GpusOpt = Annotated[int, typer.Option(min=1, help="GPUs per node.")]
NodesOpt = Annotated[int, typer.Option(min=1, help="Number of nodes.")]
GpuMemoryOpt = Annotated[str, typer.Option(help="Memory per GPU (80GiB, 512GB or bytes).")]
CpuMemoryOpt = Annotated[str, typer.Option(help="CPU memory per node.")]
SeqLenOpt = Annotated[int, typer.Option(min=1, help="Sequence length.")]
MicroBatchOpt = Annotated[int, typer.Option(min=1, help="Micro-batch per GPU.")]
GradAccumOpt = Annotated[int, typer.Option(min=1, help="Gradient accumulation steps.")]
PrecisionOpt = Annotated[Precision, typer.Option(help="Training precision.")]
StageOpt = Annotated[int, typer.Option(min=0, max=3, help="ZeRO stage.")]
OffloadOptimizerOpt = Annotated[Offload, typer.Option(help="Optimizer offload device.")]
OffloadParamOpt = Annotated[Offload, typer.Option(help="Parameter offload device (ZeRO-3).")]
NvmePathOpt = Annotated[str | None, typer.Option(help="Folder for NVMe offload.")]
CheckpointingOpt = Annotated[bool, typer.Option(help="Recompute activations in backward.")]
AttentionOpt = Annotated[Attention, typer.Option(help="Attention kernel.")]
DsConfigOpt = Annotated[str | None, typer.Option(help="DeepSpeed config JSON; wins over the flags.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object (sizes in bytes).")]
ModelImplOpt = Annotated[ModelImpl, typer.Option(help="The model trained: transformers from_config, or built-in.")]


def _flags(values: dict[str, Any], function: Callable[..., Any]) -> dict[str, Any]:
    """The command's option values (its ``locals()``) that ``function`` takes as keywords: commands sharing the
    workload options pass them on without listing them again."""
    return {name: values[name] for name in inspect.signature(function).parameters if name in values}


def _inputs(
    *,
    model: str | None,
    params: float | None = None,
    gpus: int = 1,
    nodes: int = 1,
    gpu_memory: str = "80GiB",
    cpu_memory: str = "1TiB",
    seq_len: int = 2048,
    micro_batch: int = 1,
    grad_accum: int = 1,
    precision: str = "bf16",
    stage: int = 0,
    offload_optimizer: str = "none",
    offload_param: str = "none",
    nvme_path: str | None = None,
    activation_checkpointing: bool = False,
    attention: str = "sdpa",
    device: str = "cuda",
    ds_config: str | None = None,
    model_impl: str = "transformers",
) -> tuple[Workload, dict[str, Any]]:
    """The workload and the ds_config the workload flags describe (bad input: one line, exit 2)."""
    try:
        cluster = ClusterSpec(
            gpus_per_node=gpus,
            nodes=nodes,
            gpu_memory=_size(gpu_memory, "gpu-memory"),
            cpu_memory=_size(cpu_memory, "cpu-memory"),
            device=device,
        )
        train = TrainSpec(
            seq_len=seq_len,
            micro_batch=micro_batch,
            grad_accum=grad_accum,
            precision=precision,
            activation_checkpointing=activation_checkpointing,
            attention=attention,
        )
        workload = Workload(_model(model, params, model_impl), cluster, train)
        config = _ds_config(train, stage, offload_optimizer, offload_param, nvme_path, ds_config)
        workload = with_profile(workload, precisions=(resolve(workload, config).precision,))
        estimate(workload, config)  # validates the config; cheap
    except (WorkloadError, ConfigError) as error:
        _fail(error.field, str(error).removeprefix(f"{error.field}: "))
    return workload, config


@app.command("estimate")
def estimate_command(
    model: ModelOpt = None,
    params: ParamsOpt = None,
    gpus: GpusOpt = 1,
    nodes: NodesOpt = 1,
    gpu_memory: GpuMemoryOpt = "80GiB",
    cpu_memory: CpuMemoryOpt = "1TiB",
    seq_len: SeqLenOpt = 2048,
    micro_batch: MicroBatchOpt = 1,
    grad_accum: GradAccumOpt = 1,
    precision: PrecisionOpt = "bf16",
    stage: StageOpt = 0,
    offload_optimizer: OffloadOptimizerOpt = "none",
    offload_param: OffloadParamOpt = "none",
    nvme_path: NvmePathOpt = None,
    activation_checkpointing: CheckpointingOpt = False,
    attention: AttentionOpt = "sdpa",
    device: Annotated[Device, typer.Option(help="Training device.")] = "cuda",
    ds_config: DsConfigOpt = None,
    model_impl: ModelImplOpt = "transformers",
    as_json: JsonOpt = False,
) -> None:
    """Estimate peak memory per GPU and per node's CPU for one training configuration."""
    workload, config = _inputs(**_flags(locals(), _inputs))
    est = estimate(workload, config)
    if as_json:
        typer.echo(json.dumps(est.to_dict()))
    else:
        spec = workload.model
        architecture = f" ({est.architecture})" if est.architecture and est.architecture != "params" else ""
        render(est, f"{spec.name}{architecture}: {spec.n_params:,} parameters, {workload.cluster.world_size} GPU(s)")


@app.command("measure")
def measure_command(
    model: ModelOpt = None,
    params: ParamsOpt = None,
    gpus: GpusOpt = 1,
    nodes: NodesOpt = 1,
    gpu_memory: GpuMemoryOpt = "80GiB",
    cpu_memory: CpuMemoryOpt = "1TiB",
    seq_len: SeqLenOpt = 2048,
    micro_batch: MicroBatchOpt = 1,
    grad_accum: GradAccumOpt = 1,
    precision: PrecisionOpt = "bf16",
    stage: StageOpt = 0,
    offload_optimizer: OffloadOptimizerOpt = "none",
    offload_param: OffloadParamOpt = "none",
    nvme_path: NvmePathOpt = None,
    activation_checkpointing: CheckpointingOpt = False,
    attention: AttentionOpt = "sdpa",
    device: Annotated[Device | None, typer.Option(help="Training device (default: cuda if present).")] = None,
    ds_config: DsConfigOpt = None,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up optimizer steps (not timed).")] = 2,
    steps: Annotated[int, typer.Option(min=1, help="Timed optimizer steps.")] = 5,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds before every rank is killed.")] = 600.0,
    launcher: Annotated[Launcher, typer.Option(help="Start ranks on this machine or through Ray.")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="Existing Ray cluster (with --launcher ray).")] = None,
    memory_cap: Annotated[str | None, typer.Option(help="Address-space cap per rank (CPU runs).")] = None,
    model_impl: ModelImplOpt = "transformers",
    as_json: JsonOpt = False,
) -> None:
    """Run a short real DeepSpeed training job and report throughput and peak memory per rank."""
    device = device or _default_device()
    workload, config = _inputs(**_flags(locals(), _inputs))
    if workload.model.is_bare:
        _fail("params", "a measured run needs a model architecture: use --model")
    cap = None
    try:
        cap = _size(memory_cap, "memory-cap") if memory_cap else None
    except WorkloadError as error:
        _fail(error.field, str(error).removeprefix(f"{error.field}: "))
    from tuner.measure import measure

    hf_config = load_hf_config(model)[0] if model_impl == "transformers" and model else None
    result = measure(
        workload,
        config,
        warmup=warmup,
        steps=steps,
        timeout=timeout,
        launcher=launcher,
        ray_address=ray_address,
        memory_cap=cap,
        model_impl=model_impl,
        hf_config=hf_config,
        show_progress=not as_json,
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        render_measurement(result)
    raise typer.Exit(0 if result["status"] == "ok" else 1)


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def render_measurement(result: dict[str, Any], console: Console | None = None) -> None:
    """Print a measured run: status, throughput, step times, peak memory per rank against the estimate."""
    console = console or Console()
    status = result["status"]
    console.print(f"status: [{'green' if status == 'ok' else 'red'}]{status}[/]")
    if result["error"]:
        console.print(result["error"].strip().splitlines()[-1], highlight=False, soft_wrap=True)
    if status == "ok":
        steps = result["step_time_s"]
        console.print(f"throughput: {result['tokens_per_s']:,.0f} tokens/s, {result['samples_per_s']:,.2f} samples/s")
        console.print(f"step time: p50 {steps['p50']:.3f} s, p90 {steps['p90']:.3f} s")
        console.print(f"model TFLOP/s per device: {result['tflops_per_device']:.4f}")
    table = Table()
    table.add_column("rank")
    table.add_column("peak GiB", justify="right")
    for rank, peak in enumerate(result["peak_bytes_per_rank"]):
        table.add_row(str(rank), _gib(peak))
    console.print(table)
    console.print(f"estimated peak per GPU: {_gib(result['estimate']['per_gpu']['total'])} GiB")


SamplerOpt = Annotated[Sampler, typer.Option(help="Optuna sampler: TPE, random, grid (stage × micro-batch) or GP.")]
StorageOpt = Annotated[str | None, typer.Option(help="Database URL (default: sqlite:///dstune.db).")]


def _pins(pins: list[str]) -> dict[str, Any]:
    """``--pin stage=3 --pin zero_optimization.overlap_comm=true`` as a dict (values read as YAML scalars)."""
    import yaml

    parsed: dict[str, Any] = {}
    for pin in pins:
        key, sep, value = pin.partition("=")
        if not sep or not key.strip():
            _fail("pin", f"expected KEY=VALUE, got {pin!r}")
        parsed[key.strip()] = yaml.safe_load(value)
    return parsed


@app.command("tune")
def tune_command(
    model: ModelOpt = None,
    gpus: GpusOpt = 1,
    nodes: NodesOpt = 1,
    gpu_memory: GpuMemoryOpt = "80GiB",
    cpu_memory: CpuMemoryOpt = "1TiB",
    seq_len: SeqLenOpt = 2048,
    precision: PrecisionOpt = "bf16",
    attention: AttentionOpt = "sdpa",
    device: Annotated[Device | None, typer.Option(help="Training device (default: cuda if present).")] = None,
    global_batch: Annotated[int | None, typer.Option(min=1, help="Fixed global batch (samples per step).")] = None,
    space: Annotated[str, typer.Option(help="Search space YAML (a file or a built-in name).")] = "default",
    pin: Annotated[list[str] | None, typer.Option(help="Pin a parameter: NAME=VALUE (repeatable).")] = None,
    sampler: SamplerOpt = "tpe",
    trials: Annotated[int, typer.Option(min=1, help="Trials in the study (pruned ones included).")] = 12,
    timeout: Annotated[str | None, typer.Option(help="Stop asking after this long: 8h, 30m, 1h30m.")] = None,
    storage: StorageOpt = None,
    study: Annotated[str | None, typer.Option(help="Study name; an existing one resumes.")] = None,
    launcher: Annotated[Launcher, typer.Option(help="Dispatch runs through Ray (default) or locally.")] = "ray",
    ray_address: Annotated[str | None, typer.Option(help="Existing Ray cluster address.")] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up steps per measured run.")] = 2,
    steps: Annotated[int, typer.Option(min=1, help="Timed steps per measured run.")] = 3,
    run_timeout: Annotated[float, typer.Option(min=1, help="Seconds before a measured run is killed.")] = 600.0,
    memory_cap: Annotated[str | None, typer.Option(help="Address-space cap per rank (CPU runs).")] = None,
    pareto: Annotated[bool, typer.Option(help="Also minimise peak memory (throughput-vs-headroom front).")] = False,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    nvme_path: NvmePathOpt = None,
    model_impl: ModelImplOpt = "transformers",
) -> None:
    """Search ds_configs for the fastest one that fits: prune with the estimator, measure the rest."""
    from tuner.tune import run_tune

    device = device or _default_device()
    workload, _ = _inputs(  # micro-batch, accumulation, stage and offload are what the search decides
        model=model,
        gpus=gpus,
        nodes=nodes,
        gpu_memory=gpu_memory,
        cpu_memory=cpu_memory,
        seq_len=seq_len,
        precision=precision,
        attention=attention,
        device=device,
        model_impl=model_impl,
    )
    try:
        seconds = parse_duration(timeout) if timeout else None
        cap = _size(memory_cap, "memory-cap") if memory_cap else None
    except ValueError as error:
        _fail("timeout" if "duration" in str(error) else "memory-cap", str(error))
    code = run_tune(
        workload,
        space=space,
        pins=_pins(pin or []),
        global_batch=global_batch,
        sampler=sampler,
        trials=trials,
        timeout_s=seconds,
        storage=storage,
        study=study,
        launcher=launcher,
        ray_address=ray_address,
        warmup=warmup,
        steps=steps,
        run_timeout=run_timeout,
        memory_cap=cap,
        pareto=pareto,
        seed=seed,
        nvme_path=nvme_path,
        fail=_fail,
    )
    raise typer.Exit(code)


@app.command("best")
def best_command(
    study: Annotated[str, typer.Option(help="Study name.")],
    storage: StorageOpt = None,
    format: Annotated[
        ExportFormat, typer.Option("--format", help="deepspeed, or hf (Trainer with auto).")
    ] = "deepspeed",
    out: Annotated[str | None, typer.Option(help="Write the config to this file instead of stdout.")] = None,
) -> None:
    """Print (or write) the best measured ds_config of a study, validated by DeepSpeed first."""
    from tuner.tune import export_best

    export_best(study, storage=storage, format=format, out=out, fail=_fail)


TOKEN_ENV = "DSTUNE_API_TOKEN"


def _api_token(token_file: str | None) -> str | None:
    """The API token: the file's content (stripped) when given, else ``$DSTUNE_API_TOKEN``; None when neither."""
    import os
    from pathlib import Path

    if token_file is not None:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as error:
            _fail("token-file", f"cannot read {token_file}: {error}")
        if not token:
            _fail("token-file", f"{token_file} is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


@app.command("serve")
def serve_command(
    storage: StorageOpt = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    token_file: Annotated[
        str | None, typer.Option(help=f"File holding the API bearer token (default: ${TOKEN_ENV}).")
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow POST/DELETE /v1/jobs without any token.")
    ] = False,
    max_body_bytes: Annotated[
        int, typer.Option(min=1024, help="Largest request body accepted (413 above).")
    ] = 1_000_000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    workers: Annotated[int, typer.Option(min=1, help="Server processes (uvicorn workers).")] = 1,
    recommend_cache: Annotated[
        float, typer.Option(min=0, help="Seconds a recommendation is reused per workload (0: never).")
    ] = 2.0,
) -> None:
    """Serve the HTTP API (estimate, recommend, studies, jobs) on the tuner's database."""
    import os

    import uvicorn

    from tuner.api import create_app
    from tuner.store import default_url

    token = _api_token(token_file)
    if token is None and not insecure_no_auth:
        _fail("token", f"no API token: set ${TOKEN_ENV} or --token-file (or pass --insecure-no-auth deliberately)")
    url = storage or os.environ.get("DSTUNE_STORAGE") or default_url()
    application = create_app(
        url,
        token,
        insecure_no_auth=insecure_no_auth,
        max_body_bytes=max_body_bytes,
        recommend_cache_s=recommend_cache,
        freeze_gc=True,
    )
    if workers == 1:
        uvicorn.run(application, host=host, port=port, log_level=log_level)
        return
    application.state.store.close()  # migrated; each worker process opens its own
    os.environ.update(
        {
            "DSTUNE_STORAGE": url,
            "DSTUNE_API_TOKEN": token or "",
            "DSTUNE_INSECURE_NO_AUTH": "1" if insecure_no_auth else "0",
            "DSTUNE_MAX_BODY_BYTES": str(max_body_bytes),
            "DSTUNE_RECOMMEND_CACHE_S": str(recommend_cache),
        }
    )
    uvicorn.run(
        "tuner.api:create_app_from_env", factory=True, host=host, port=port, log_level=log_level, workers=workers
    )


@app.command("worker")
def worker_command(
    storage: StorageOpt = None,
    once: Annotated[
        bool,
        typer.Option(help="Exit when the queue is empty (with --submit: and its jobs have ended) instead of polling."),
    ] = False,
    poll: Annotated[float, typer.Option(min=0.1, help="Seconds between looks at an empty queue.")] = 5.0,
    name: Annotated[
        str | None, typer.Option(help="Worker name recorded on its jobs (default host:pid:thread).")
    ] = None,
    job: Annotated[int | None, typer.Option(min=1, help="Run this one job (what a Ray submission runs).")] = None,
    launcher: Annotated[Launcher | None, typer.Option(help="Override the jobs' launcher.")] = None,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster for the trials; with --submit, the Ray Jobs API address.")
    ] = None,
    submit: Annotated[
        bool, typer.Option(help="Submit each job to the Ray cluster (Jobs API at --ray-address) instead of running it.")
    ] = False,
) -> None:
    """Take queued tuning jobs from the database and run them as studies (or submit them to a Ray cluster)."""
    import functools
    import os

    from tuner.store import Store, StoreError, default_url
    from tuner.worker import run_job, run_study_job, submit_loop, work

    url = storage or os.environ.get("DSTUNE_STORAGE") or default_url()
    store = Store.open(url)
    if submit:
        if not ray_address:
            _fail("ray-address", "--submit needs the Ray Jobs API address, e.g. http://HEAD:8265")
        try:
            submitted = submit_loop(store, ray_address, url, once=once, poll=poll, name=name, launcher=launcher)
        except ConnectionError as error:  # no Jobs API at that address
            _fail("ray-address", str(error))
        typer.echo(f"submitted {len(submitted)} job(s) to {ray_address}")
        return
    executor = functools.partial(run_study_job, launcher=launcher, ray_address=ray_address)
    if job is not None:
        try:
            status = run_job(store, job, executor)
        except StoreError as error:
            _fail(error.field, str(error).removeprefix(f"{error.field}: "))
        typer.echo(f"job {job}: {status}")
        raise typer.Exit(0 if status in ("done", "cancelled") else 1)
    try:
        ran = work(store, name, executor, once=once, poll=poll)
    except KeyboardInterrupt:
        typer.echo("interrupted: the running job is marked failed; its finished trials are recorded", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"ran {len(ran)} job(s)")
