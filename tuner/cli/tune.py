"""``dstune tune`` and ``dstune best``: run a study with a live display and print what was found; export the best
config of a study.

The study, storage and measurement rooms are imported when a command runs, so ``dstune estimate`` starts without
them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tuner.cli.common import fail, require_local_cuda, size, write_text_file
from tuner.cli.options import (
    AUTO_DEVICE,
    TUNE_FLAGS,
    NvmePathOpt,
    StepsOpt,
    StorageOpt,
    WarmupMaxOpt,
    WarmupOpt,
    WorkloadFlags,
    build,
    warmup_limit,
    workload_options,
)
from tuner.measure.options import MEASURE_DEFAULTS, MeasureOptions
from tuner.requests import Launcher, Sampler, check_study_name, default_study_name, readable_name
from tuner.units import GiB, format_duration, parse_duration
from tuner.workload import MEASURED_QUANTIZATION

if TYPE_CHECKING:
    from tuner.storage import Store
    from tuner.study import TuningStudy
    from tuner.workload import Workload

ExportFormat = Literal["deepspeed", "hf"]
SamplerOpt = Annotated[Sampler, typer.Option(help="Optuna sampler: TPE, random, grid (stage × micro-batch) or GP.")]


def _pins(pins: list[str]) -> dict[str, Any]:
    """``--pin stage=3 --pin zero_optimization.overlap_comm=true`` as a dict (values read as YAML scalars)."""
    import yaml

    parsed: dict[str, Any] = {}
    for pin in pins:
        key, sep, value = pin.partition("=")
        if not sep or not key.strip():
            fail("pin", f"expected KEY=VALUE, got {pin!r}")
        parsed[key.strip()] = yaml.safe_load(value)
    return parsed


@workload_options(only=TUNE_FLAGS, overrides=AUTO_DEVICE)
def tune_command(
    flags: WorkloadFlags,
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
    warmup: WarmupOpt = MEASURE_DEFAULTS.warmup,
    warmup_max: WarmupMaxOpt = None,
    steps: StepsOpt = MEASURE_DEFAULTS.steps,
    run_timeout: Annotated[
        float, typer.Option(min=1, help="Seconds before a measured run is killed.")
    ] = MEASURE_DEFAULTS.timeout,
    memory_cap: Annotated[str | None, typer.Option(help="Address-space cap per rank (CPU runs).")] = None,
    pareto: Annotated[bool, typer.Option(help="Also minimise peak memory (throughput-vs-headroom front).")] = False,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    nvme_path: NvmePathOpt = None,
) -> None:
    """Search ds_configs for the fastest one that fits: prune with the estimator, measure the rest."""
    warmup_max = warmup_limit(warmup, warmup_max)
    require_local_cuda(flags.device, launcher, ray_address)  # before the workload is built (it loads the model)
    workload, _ = build(flags)  # micro-batch, accumulation, stage and offload are what the search decides
    if workload.trainable.quantization:
        fail("quantization", MEASURED_QUANTIZATION)
    try:
        seconds = parse_duration(timeout) if timeout else None
    except ValueError as error:
        fail("timeout", str(error))
    cap = size(memory_cap, "memory-cap") if memory_cap else None
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
        warmup_max=warmup_max,
        steps=steps,
        run_timeout=run_timeout,
        memory_cap=cap,
        pareto=pareto,
        seed=seed,
        nvme_path=nvme_path,
    )
    raise typer.Exit(code)


def best_command(
    study: Annotated[str, typer.Option(help="Study name.")],
    storage: StorageOpt = None,
    format: Annotated[
        ExportFormat, typer.Option("--format", help="deepspeed, or hf (Trainer with auto).")
    ] = "deepspeed",
    out: Annotated[str | None, typer.Option(help="Write the config to this file instead of stdout.")] = None,
) -> None:
    """Print (or write) the best measured ds_config of a study, validated by DeepSpeed first."""
    export_best(study, storage=storage, format=format, out=out)


def run_tune(
    workload: Workload,
    *,
    space: str,
    pins: dict[str, Any],
    global_batch: int | None,
    sampler: str,
    trials: int,
    timeout_s: float | None,
    storage: str | None,
    study: str | None,
    launcher: str,
    ray_address: str | None,
    warmup: int,
    warmup_max: int | None,
    steps: int,
    run_timeout: float,
    memory_cap: int | None,
    pareto: bool,
    seed: int | None,
    nvme_path: str | None,
) -> int:
    """Run a study to its budget and print the top configs; 0 when a config was measured, 1 otherwise."""
    from tuner.estimator import ConfigError
    from tuner.measure.dispatch import Dispatcher
    from tuner.measure.op_builds import AnnounceBuilds
    from tuner.space import SpaceError, resolve_space
    from tuner.storage import Store, StoreError, default_url
    from tuner.study import Event, Measurer, StudySettings, TuningStudy

    console = Console()
    name = default_study_name(workload) if study is None else check_study_name(study, "study")
    settings = StudySettings(
        name=name,
        workload=workload,
        space_path=resolve_space(space),
        pins=pins,
        global_batch=global_batch,
        sampler=sampler,
        trials=trials,
        timeout_s=timeout_s,
        pareto=pareto,
        seed=seed,
        nvme_path=nvme_path,
        dispatch=MeasureOptions(launcher, ray_address, warmup, steps, run_timeout, memory_cap, warmup_max),
    )
    try:
        store = Store.open(storage or default_url())
        tuning = TuningStudy(settings, store)
    except SpaceError as error:
        fail("space", str(error))
    except (ConfigError, StoreError) as error:
        fail(error.field, error.message)
    if workload.cluster.device == "cpu":
        warn_slow_runs(tuning, warmup, steps, console)
    best = {"tokens": 0.0}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"study {name}", total=trials, best="")

        def on_event(event: Event) -> None:
            if event.status == "running":
                return
            if event.status == "ok" and (event.tokens_per_s or 0) > best["tokens"]:
                best["tokens"] = event.tokens_per_s or 0.0
            progress.update(
                task,
                completed=tuning.configs_recorded(),
                best=f"best {best['tokens']:,.0f} tokens/s" if best["tokens"] else "",
            )

        tuning.on_event = on_event
        dispatcher = Dispatcher(settings.dispatch, workload.cluster.device, workload.cluster.world_size)
        measurer: Measurer = dispatcher
        if launcher == "local" or ray_address is None:  # the ranks, and so the builds, run on this machine
            measurer = AnnounceBuilds(dispatcher, lambda line: console.print(line, highlight=False, soft_wrap=True))
        try:
            report = tuning.run(measurer)
        finally:
            dispatcher.close(wait=False)
    render_study(store, tuning.study_id, name, console)
    if report.interrupted:
        console.print("[yellow]interrupted[/]: finished trials are recorded; run the same command to resume")
    if report.exhausted:
        recorded = tuning.configs_recorded()
        console.print(
            f"the search space has no new config to offer: {recorded} distinct configs recorded, fewer than the "
            f"{trials} asked for (the sampler's last proposals all repeated recorded ones)",
            highlight=False,
        )
    return 0 if store.best_trial(tuning.study_id) is not None else 1


SLOW_RUN_S = 60.0  # a CPU run predicted longer than this is announced before the study starts


def warn_slow_runs(tuning: TuningStudy, warmup: int, steps: int, console: Console) -> None:
    """Say up front when the first measured run will be slow on this CPU: its seconds as the throughput model predicts
    them (warm-up and timed steps at the predicted step time), and what makes runs shorter."""
    first = tuning.guide.first_run()
    if first is None:
        return
    step_s = first.prediction.step_time_s
    run_s = (warmup + steps) * step_s
    if run_s < SLOW_RUN_S:
        return
    config = first.suggestion.trial.ds_config
    tokens = config["train_batch_size"] * tuning.settings.workload.train.seq_len
    console.print(
        f"[yellow]slow runs ahead[/]: the first measured run takes about {format_duration(run_s)} on this CPU "
        f"({warmup} warm-up + {steps} timed steps of ~{format_duration(step_s)}, {tokens:,} tokens a step, as the "
        "throughput model predicts); a fixed --global-batch, a shorter --seq-len or fewer --steps make runs shorter",
        highlight=False,
        soft_wrap=True,
    )


STOPPED_EARLY_NOTE = "stopped"


TOP_COLUMNS = ("trial", "tokens/s", "peak GiB", "free GiB", "ZeRO", "micro", "accum", "offload", "ckpt")


def top_configs_table(store: Store, study_id: int, name: str, top: int = 5) -> tuple[Table, bool]:
    """The top measured configs as a table whose figures never fold or shrink (headers wrap instead, and the note
    column appears only when a run was stopped early); and whether any row is partial."""
    rows: list[list[str]] = []
    partial = False
    for trial in store.trials(study_id, status="ok", order_by="-tokens_per_s", limit=top):
        zero = trial.ds_config.get("zero_optimization", {})
        gpu_memory = (trial.estimate or {}).get("gpu_memory", 0)
        peak = trial.peak_bytes
        stopped = bool((trial.measurement or {}).get("stopped_early"))
        partial = partial or stopped
        offload = [
            (zero.get(section) or {}).get("device", "none") for section in ("offload_optimizer", "offload_param")
        ]
        rows.append(
            [
                str(trial.number),
                f"{trial.tokens_per_s:,.0f}",
                "-" if peak is None else f"{peak / GiB:.3f}",
                "-" if peak is None else f"{(gpu_memory - peak) / GiB:.2f}",
                str(zero.get("stage", 0)),
                str(trial.ds_config.get("train_micro_batch_size_per_gpu")),
                str(trial.ds_config.get("gradient_accumulation_steps")),
                "/".join(offload) if offload[1] != "none" else offload[0],
                "yes" if trial.activation_checkpointing else "no",
            ]
            + ([STOPPED_EARLY_NOTE] if stopped else [""])
        )
    columns = TOP_COLUMNS + (("note",) if partial else ())
    # no vertical rules: ten columns of figures fit in 80 columns; numbers keep their width, words may wrap
    table = Table(
        title=f"study {name}: top configs", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False
    )
    for index, column in enumerate(columns):
        numeric = column not in ("offload", "note")
        words = [word for text in (column, *(row[index] for row in rows)) for word in text.split()]
        table.add_column(
            column, justify="right" if numeric else "left", min_width=max(map(len, words)), overflow="fold"
        )
    for row in rows:
        table.add_row(*row[: len(columns)])
    return table, partial


def render_study(store: Store, study_id: int, name: str, console: Console, top: int = 5) -> None:
    """The top measured configs (runs the throughput pruner stopped early marked: their figures are partial), and
    what was pruned and why."""
    summary = store.study_summary(study_id)
    table, partial = top_configs_table(store, study_id, name, top)
    console.print(table)
    if partial:
        console.print(
            f"{STOPPED_EARLY_NOTE}: the run was clearly slower than the best and was stopped early, after its first "
            "timed steps, so its figures are partial (tokens/s from those steps only)",
            highlight=False,
            soft_wrap=True,
        )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items()) if v)
    console.print("trials by status: " + (counts or "none yet"), highlight=False)
    render_pruned(store, study_id, console)
    best = store.best_trial(study_id)
    if best is not None:
        console.print(f"best: trial {best.number}, {best.tokens_per_s:,.0f} tokens/s; its ds_config:", highlight=False)
        console.print_json(json.dumps(best.ds_config))


def render_pruned(store: Store, study_id: int, console: Console, kinds: int = 5) -> None:
    """The pruned trials grouped by kind (memory · phase · largest category), each kind with one of its reasons."""
    from tuner.forecast import group_reasons

    pruned = store.trials(study_id, status="pruned")
    groups = group_reasons(trial.prune_reason for trial in pruned)
    if not groups:
        return
    console.print(f"pruned without a run: {len(pruned)}, by kind")
    for group in groups[:kinds]:
        console.print(f"  ×{group.count}  {group.key} — e.g. {group.example}", highlight=False, soft_wrap=True)
    if len(groups) > kinds:
        console.print(f"  … and {len(groups) - kinds} more kinds (the dashboard lists them all)", highlight=False)


def export_best(study: str, *, storage: str | None, format: str, out: str | None) -> None:
    """Write the best measured ds_config of ``study``, after DeepSpeed's own validation."""
    from tuner.estimator import ConfigError
    from tuner.space.dsconfig import export_config, validate_with_deepspeed
    from tuner.storage import Store, default_url

    store = Store.open(storage or default_url())
    record = store.get_study(readable_name(study, "study"))
    if record is None:
        fail("study", f"no study named {study!r} in {store.url}")
    best = store.best_trial(record.id)
    if best is None:
        fail("study", f"study {study!r} has no successfully measured trial yet")
    workload = store.workload_of(record.id)
    world = workload.cluster.world_size
    try:
        validate_with_deepspeed(best.ds_config, world)
    except ConfigError as error:
        fail(error.field, f"DeepSpeed rejects the stored config: {error}")
    config, notes = export_config(best.trial, format, workload.train.attention, workload.trainable)
    text = json.dumps(config, indent=2) + "\n"
    if out:
        write_text_file(out, text)
        Console(stderr=True).print(f"wrote {out} (trial {best.number}, {best.tokens_per_s:,.0f} tokens/s)")
    else:
        print(text, end="")
    for note in notes:
        Console(stderr=True).print(note, highlight=False, soft_wrap=True)
