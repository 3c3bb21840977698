"""``dstune tune`` and ``dstune best``: run a study with a live display and print what was found
(:mod:`tuner.cli.tuning`, :mod:`tuner.cli.study_view`); export the best config of a study.

The study, storage and measurement rooms are imported when a command runs, so ``dstune estimate`` starts without
them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console

from tuner.cli.best_choice import best_for_format, study_to_export
from tuner.cli.common import fail, memory_cap_bytes, write_text_file
from tuner.cli.confirm_view import ConfirmOpt, confirmation_notes
from tuner.cli.local_gpu import checked_here
from tuner.cli.options import (
    LONG_CONTEXT_PINS,
    TUNE_FLAGS,
    TUNE_OVERRIDES,
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
from tuner.cli.out_guard import refuse_database_out
from tuner.cli.script_model import no_model_workload, say_no_model, seq_len_known, without_model
from tuner.cli.script_options import (
    ArgMappingOpt,
    CommandArg,
    DsConfigAtOpt,
    script_command,
    script_flags,
    script_pins,
    script_study_name,
)
from tuner.cli.script_view import export_script_best
from tuner.cli.study_view import launch_notes
from tuner.cli.tune_max import SearchOptions, seq_len_of, tune_max
from tuner.cli.tuning import run_tune
from tuner.measure.options import MEASURE_DEFAULTS, MeasureOptions
from tuner.requests import Launcher, Sampler, check_study_name, default_study_name, readable_name
from tuner.units import parse_duration
from tuner.workload import hpz_problem
from tuner.workload.layout_checks import HPZ_KEY
from tuner.workload.layouts import HPZ
from tuner.workload.measurable import measurement_refusal

if TYPE_CHECKING:
    from tuner.measure.script.command import ScriptCommand
    from tuner.study import StudySettings
    from tuner.workload import Workload

ExportFormat = Literal["deepspeed", "hf"]
SamplerOpt = Annotated[
    Sampler,
    typer.Option(
        help="Optuna sampler: TPE, random, grid (stage × micro-batch, × the numerics choices when allowed) or GP."
    ),
]


def _long_context_pins(flags: WorkloadFlags) -> dict[str, Any]:
    """``--sequence-parallel``, ``--tiled-mlp``, ``--tiled-loss`` and ``--offload-checkpoints`` as pins of the
    space's parameters (the flags given; the others are searched where the space offers them)."""
    return {pin: flags.value(flag) for flag, pin in LONG_CONTEXT_PINS.items() if flags.value(flag) is not None}


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


SearchThreadsOpt = Annotated[
    bool,
    typer.Option(help="Also search OpenMP threads per rank (offload's CPU Adam, CPU ranks), within --cores-per-node."),
]
AllowNumericsOpt = Annotated[
    bool,
    typer.Option(
        help="Also search choices that change the numerics or the loss's code path: bf16 master weights and "
        "optimizer states, Muon, DeepSpeed's chunked cross-entropy (recorded with the study; best says which)."
    ),
]
PatienceOpt = Annotated[
    int | None,
    typer.Option(
        min=0,
        help="Stop once the best config stood for this many measured trials after it (0: never; default: 2 for a "
        "training command's study, never for dstune's own trainer's).",
    ),
]


def study_patience(patience: int | None, script: ScriptCommand | None) -> int | None:
    """``--patience``, or its default: :data:`tuner.study.SCRIPT_PATIENCE` for a training command's study, else none.

    >>> study_patience(None, None), study_patience(0, None), study_patience(3, None)
    (None, None, 3)
    """
    from tuner.study import SCRIPT_PATIENCE

    if patience is None:
        return SCRIPT_PATIENCE if script is not None else None
    return patience or None


CoresPerNodeOpt = Annotated[
    int | None,
    typer.Option(min=1, help="Cores per node the ranks' threads may use together (default: this machine's)."),
]


@workload_options(only=TUNE_FLAGS, overrides=TUNE_OVERRIDES)
def tune_command(
    ctx: typer.Context,
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
    search_threads: SearchThreadsOpt = False,
    allow_numerics_changes: AllowNumericsOpt = False,
    cores_per_node: CoresPerNodeOpt = None,
    ds_config_at: DsConfigAtOpt = None,
    arg_mapping: ArgMappingOpt = None,
    confirm: ConfirmOpt = None,
    patience: PatienceOpt = None,
    command: CommandArg = None,
) -> None:
    """Search ds_configs for the fastest that fits: the estimator prunes, runs measure (--seq-len max: the longest)."""
    script = script_command(command, ds_config_at, arg_mapping)
    timing = (warmup, warmup_max, steps, run_timeout)
    flags, dispatch = _measure_options(flags, launcher, ray_address, timing, memory_cap, script)
    seq_len = seq_len_of(str(flags.seq_len))
    flags, study, pin = _script_study(flags, script, study, space, pin, seq_len)
    if seq_len is None:
        search = SearchOptions(dispatch, study, storage, trials, _pins(pin or []), nvme_path)
        raise typer.Exit(tune_max(ctx, flags, search))
    workload = tuning_workload(replace(flags, seq_len=seq_len), script)  # flags' long-context pins: below
    settings = tune_settings(
        workload,
        space=space,
        study=study,
        dispatch=dispatch,
        pins={**_long_context_pins(flags), **_pins(pin or [])},
        global_batch=global_batch,
        sampler=sampler,
        trials=trials,
        timeout_s=_study_timeout(timeout),
        pareto=pareto,
        seed=seed,
        nvme_path=nvme_path,
        thread_budget=thread_budget(search_threads, cores_per_node, workload.cluster.gpus_per_node),
        allow_numerics_changes=allow_numerics_changes,
        patience=study_patience(patience, script),
    )
    raise typer.Exit(run_tune(settings, storage, confirm))


def _measure_options(
    flags: WorkloadFlags,
    launcher: Launcher,
    ray_address: str | None,
    timing: tuple[int, int | None, int, float],
    memory_cap: str | None,
    script: ScriptCommand | None,
) -> tuple[WorkloadFlags, MeasureOptions]:
    """How each run is measured (``timing``: warm-up steps, their cap, timed steps, the run's timeout), checked
    against the launcher and this machine before the workload is built (it loads the model)."""
    warmup, warmup_max, timed, run_timeout = timing
    warmup_max = warmup_limit(warmup, warmup_max)
    flags = checked_here(flags, launcher, ray_address)
    cap = memory_cap_bytes(memory_cap, flags.device)
    known = seq_len_known(flags)
    return flags, MeasureOptions(launcher, ray_address, warmup, timed, run_timeout, cap, warmup_max, script, known)


def _study_timeout(timeout: str | None) -> float | None:
    """``--timeout`` in seconds (exit 2 when it does not read as a duration)."""
    try:
        return parse_duration(timeout) if timeout else None
    except ValueError as error:
        fail("timeout", str(error))


def _script_study(
    flags: WorkloadFlags,
    script: ScriptCommand | None,
    study: str | None,
    space: str,
    pin: list[str] | None,
    seq_len: Any,
) -> tuple[WorkloadFlags, str | None, list[str] | None]:
    """A script study's flags (its ds_config's precision), name (the workload's marked with the command) and pins
    (what the command decides for itself); without a command, the ones given."""
    if script is None:
        return flags, study, pin
    if seq_len is None:
        fail("seq-len", "--seq-len max measures dstune's own trainer, not a training command")
    if without_model(flags):
        say_no_model()
    flags = script_flags(flags, script)
    workload = tuning_workload(flags, script)
    # a command's own model is named by the command already (tuner.workload.unknown_model)
    default = default_study_name(workload)
    name = study or (default if workload.model.is_unknown else script_study_name(default, script))
    return flags, name, [*script_pins(space), *(pin or [])]


def tuning_workload(flags: WorkloadFlags, script: ScriptCommand | None = None) -> Workload:
    """The workload a study tunes, refused (exit 2) when no run of it can be measured (by dstune's trainer: a
    training command trains its own model)."""
    # micro-batch, accumulation, stage and offload are what the search decides: --hpz is checked against the ranks
    # here (its pin pins stage 3, tuner.space.pins), the rest of the layout in build
    if script is not None and without_model(flags):
        workload, _ = no_model_workload(replace(flags, layouts={**flags.layouts, HPZ.field: 1}), script)
    else:
        workload, _ = build(replace(flags, layouts={**flags.layouts, HPZ.field: 1}))
    hpz_wrong = hpz_problem(3, flags.layouts[HPZ.field] or 1, workload.cluster.world_size)
    if hpz_wrong:
        fail(HPZ_KEY, hpz_wrong)
    refusal = measurement_refusal(workload) if script is None else None
    if refusal:
        fail(*refusal)
    return workload


def thread_budget(search: bool, cores_per_node: int | None, ranks_per_node: int) -> int | None:
    """The cores per node ``--search-threads`` may share among a node's ranks (``--cores-per-node``, else this
    machine's physical cores); None when threads are not searched. Exits 2 when one thread per rank does not fit.

    >>> thread_budget(True, 8, 2), thread_budget(False, None, 2)
    (8, None)
    """
    if not search:
        if cores_per_node is not None:
            fail("cores-per-node", "only with --search-threads (the budget of the threads it searches)")
        return None
    if cores_per_node is None:
        from tuner.measure.driver.launch_env import physical_cores

        cores_per_node = physical_cores()
    if cores_per_node < ranks_per_node:
        fail("cores-per-node", f"{cores_per_node} cores cannot give each of {ranks_per_node} ranks a thread")
    return cores_per_node


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


def tune_settings(
    workload: Workload,
    *,
    space: str,
    study: str | None,
    dispatch: MeasureOptions,
    **search: Any,
) -> StudySettings:
    """The study's settings: its name (``--study``, else the model's name and the workload's fingerprint), the space
    resolved, how runs are measured, and the search options (pins, global batch, sampler, budget...)."""
    from tuner.space import check_global_batch, resolve_space
    from tuner.study import StudySettings

    name = default_study_name(workload) if study is None else check_study_name(study, "study")
    if search.get("global_batch") is not None:  # before the study is created and Ray started
        check_global_batch(search["global_batch"], workload.cluster.world_size)
    return StudySettings(name=name, workload=workload, space_path=resolve_space(space), dispatch=dispatch, **search)


def export_best(study: str, *, storage: str | None, format: str, out: str | None) -> None:
    """Write the best measured ds_config of ``study``, after DeepSpeed's own validation."""
    from tuner.env import storage_url
    from tuner.estimator import ConfigError
    from tuner.space.dsconfig import export_config, validate_with_deepspeed
    from tuner.storage import Store

    if out:
        refuse_database_out(out)  # the study's own database named by mistake
    store = Store.open(storage_url(storage))
    record, picked = study_to_export(store, readable_name(study, "study"))
    best = store.best_trial(record.id)
    if best is None:
        fail("study", f"study {study!r} has no successfully measured trial yet")
    best, chosen = best_for_format(store, record, best, format)
    if export_script_best(best, out):  # the command's own config, as it trained with it
        return
    workload = store.workload_of(record.id)
    world = workload.cluster.world_size
    try:
        validate_with_deepspeed(best.trial.deepspeed_config(world), best.trial.deepspeed_world(world))
    except ConfigError as error:
        fail(error.field, f"DeepSpeed rejects the stored config: {error}")
    config, notes = export_config(
        best.trial, format, workload.train.attention, workload.trainable, workload.train.seq_len
    )
    notes += launch_notes(workload, (best.measurement or {}).get("launch"), out or "ds_config.json")
    notes += [note for note in (chosen, picked) if note]
    notes += confirmation_notes(best)
    text = json.dumps(config, indent=2) + "\n"
    if out:
        write_text_file(out, text)
        Console(stderr=True).print(
            f"wrote {out} (trial {best.number}, {best.tokens_per_s:,.0f} tokens/s)", markup=False
        )
    else:
        print(text, end="")
    for note in notes:
        Console(stderr=True).print(note, highlight=False, soft_wrap=True, markup=False)
