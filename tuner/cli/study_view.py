"""What ``dstune tune`` shows of a study: a warning before slow CPU runs, the top measured configs (runs stopped early
marked partial), the pruned ones grouped by kind, and the best config."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.table import Table

from tuner.cli.confirm_view import print_confirmation
from tuner.cli.facts_view import print_numerics
from tuner.cli.script_view import render_script_best
from tuner.units import format_duration, memory_unit
from tuner.workload import TrialConfig
from tuner.workload.differences import (
    COLUMN_KEYS,
    describe_differences,
    differing_keys,
    layout_keys,
    trial_settings,
)
from tuner.workload.layouts import LAYOUTS

if TYPE_CHECKING:
    from tuner.storage import Store, TrialRecord
    from tuner.study import TuningStudy
    from tuner.workload import Workload

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
WORDS = ("offload", "layout", "note")  # the columns of words (left-aligned, may wrap); the rest are figures


def layout_text(config: TrialConfig) -> str:
    """What a config adds to data parallelism, for the table: ``SP 2 · hpZ 2 · tiled MLP 4`` (empty for none): each
    layout of the registry above degree 1, then ALST's tiling and checkpoint offload.

    >>> layout_text(TrialConfig({"sequence_parallel_size": 2, "dstune": {"tiled_mlp_shards": 4}}))
    'SP 2 · tiled MLP 4'
    """
    degrees = [f"{kind.label} {config.layout.degree(kind)}" for kind in LAYOUTS if config.layout.degree(kind) > 1]
    parts = [*degrees, config.long_context.summary()]
    return " · ".join(part for part in parts if part)


def _budget(store: Store, study_id: int, found: list[TrialRecord]) -> int:
    """The study's GPU memory budget: its trials' estimates', else its workload's (a run without an estimate)."""
    budget = max(((trial.estimate or {}).get("gpu_memory") or 0 for trial in found), default=0)
    if budget:
        return int(budget)
    record = store.get_study(study_id)
    return 0 if record is None else store.get_workload(record.workload_id).gpu_memory


def _figures(trial: TrialRecord, budget: int, unit: str, scale: int) -> list[str]:
    """A row's tokens/s, peak and free memory (``-`` where not measured)."""
    gpu_memory = (trial.estimate or {}).get("gpu_memory") or budget
    peak = trial.peak_bytes
    return [
        "-" if trial.tokens_per_s is None else f"{trial.tokens_per_s:,.0f}",  # stopped early, length unknown
        "-" if peak is None else f"{peak / scale:.{3 if unit == 'GiB' else 1}f}",
        "-" if peak is None or not gpu_memory else f"{(gpu_memory - peak) / scale:.{2 if unit == 'GiB' else 1}f}",
    ]


def top_configs_table(store: Store, study_id: int, name: str, top: int = 5) -> tuple[Table, bool, list[str]]:
    """The top measured configs as a table whose figures never fold or shrink (headers wrap instead; the layout
    column appears when a config has Ulysses, AutoTP, AutoEP, ALST's tiling or hpZ, the note column when a run was
    stopped early; memory in MiB under a budget below 1 GiB); whether any row is partial; and, for each row, the
    settings no column shows in which the rows differ (``trial 3: overlap_comm=false · ...``; none when they differ
    only in the columns)."""
    rows: list[list[str]] = []
    found = store.trials(study_id, status="ok", order_by="-tokens_per_s", limit=top)
    budget = _budget(store, study_id, found)
    unit, scale = memory_unit(budget)
    settings = [trial_settings(trial.trial) for trial in found]
    others = differing_keys(settings, (*COLUMN_KEYS, *layout_keys()))
    stopped = [bool((trial.measurement or {}).get("stopped_early")) for trial in found]
    for trial, partial in zip(found, stopped, strict=True):
        config = trial.trial
        offload = [config.zero.offload_optimizer.device, config.zero.offload_param.device]
        micro, accum = config.batch
        offload_text = "/".join(offload) if offload[1] != "none" else offload[0]
        rows.append(
            [
                str(trial.number),
                *_figures(trial, budget, unit, scale),
                *(str(value) for value in (config.stage, micro, accum)),
                offload_text,
                "yes" if trial.activation_checkpointing else "no",
                layout_text(config),
                STOPPED_EARLY_NOTE if partial else "",
            ]
        )
    optional = {"layout": -2, "note": -1}
    kept = [column for column, index in optional.items() if any(row[index] for row in rows)]
    columns = [c.replace("GiB", unit) for c in TOP_COLUMNS] + kept
    keep = [*range(len(TOP_COLUMNS)), *(optional[column] for column in kept)]
    table = _table(name, columns, [[row[index] for index in keep] for row in rows])
    differences = [
        f"trial {trial.number}: {describe_differences(values, others) or '(sets none of them)'}"
        for trial, values in zip(found, settings, strict=True)
    ]
    return table, any(stopped), differences if others else []


def _table(name: str, columns: list[str], rows: list[list[str]]) -> Table:
    """The rows under their columns: figures right-aligned and whole, words left-aligned and wrapping."""
    # no vertical rules: ten columns of figures fit in 80 columns; numbers keep their width, words may wrap
    table = Table(
        title=f"study {name}: top configs", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False
    )
    for index, column in enumerate(columns):
        numeric = column not in WORDS
        words = [word for text in (column, *(row[index] for row in rows)) for word in text.split()]
        table.add_column(
            column, justify="right" if numeric else "left", min_width=max(map(len, words)), overflow="fold"
        )
    for row in rows:
        table.add_row(*row)
    return table


def render_study(store: Store, study_id: int, name: str, console: Console, top: int = 5) -> None:
    """The top measured configs (runs the throughput pruner stopped early marked: their figures are partial), and
    what was pruned and why."""
    summary = store.study_summary(study_id)
    table, partial, differences = top_configs_table(store, study_id, name, top)
    console.print(table)
    if differences:
        console.print("where these configs also differ (their ds_config keys):", highlight=False)
        for line in differences:
            console.print(f"  {line}", highlight=False, soft_wrap=True, markup=False)
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
    if best is not None and render_script_best(best, console):
        return
    if best is not None:
        console.print(f"best: trial {best.number}, {best.tokens_per_s:,.0f} tokens/s; its ds_config:", highlight=False)
        console.print_json(json.dumps(best.trial.deepspeed_config()))  # as DeepSpeed gets it (dstune best exports it)
        print_numerics(best, console)
        print_confirmation(best, console)
        launch = (best.measurement or {}).get("launch")
        for line in launch_lines("measured in: ", launch):
            console.print(line, highlight=False, soft_wrap=True, markup=False)


def launch_lines(label: str, launch: dict[str, Any] | None) -> list[str]:
    """The launch environment a run was measured in, after ``label``, and the warning when its ranks' threads
    outnumber the cores (:func:`oversubscribed`); empty without a ``launch`` record."""
    measured_in = describe_launch(launch)
    crowded = oversubscribed(launch)
    return [*([label + measured_in] if measured_in else []), *([crowded] if crowded else [])]


def describe_launch(launch: dict[str, Any] | None) -> str | None:
    """One line on the launch environment a run was measured in (its ``launch`` record), or None without one.

    >>> describe_launch({"launcher": "deepspeed", "bind_cores": False, "threads_per_rank": [2, 2],
    ...                  "affinity_per_rank": [[0, 1], [0, 1]], "rule": "torch's default",
    ...                  "reported_variables": {"OMP_NUM_THREADS": "2"}})
    "deepspeed launcher, threads per rank 2, 2 (torch's default), cores 0-1 | 0-1; OMP_NUM_THREADS=2"
    """
    if not launch:
        return None
    threads = ", ".join(str(count) for count in launch.get("threads_per_rank") or []) or "?"
    cores = " | ".join(_cores(affinity) for affinity in launch.get("affinity_per_rank") or [])
    variables = " ".join(f"{k}={v}" for k, v in sorted((launch.get("reported_variables") or {}).items()))
    text = f"{launch.get('launcher')} launcher{', bound' if launch.get('bind_cores') else ''}, threads per rank "
    text += f"{threads} ({launch.get('rule')})" + (f", cores {cores}" if cores else "")
    return text + (f"; {variables}" if variables else "")


def _cores(affinity: list[int] | None) -> str:
    """A core list as ranges: [0, 1, 2, 5] → 0-2,5."""
    spans: list[list[int]] = []
    for core in sorted(affinity or []):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans) or "-"


def launch_notes(workload: Workload, launch: dict[str, Any] | None, config_file: str) -> list[str]:
    """What goes beside an exported config so the user runs what was measured: the launch environment the winner
    ran in and the command line that reproduces it."""
    from tuner.workload import launch_command

    threads = ((launch or {}).get("threads_per_rank") or [None])[0]
    cluster = workload.cluster
    command = launch_command(workload.launch, cluster.gpus_per_node, cluster.nodes, threads, config_file)
    return [*launch_lines("measured in: ", launch), f"launch it as measured: {command}"]


def oversubscribed(launch: dict[str, Any] | None) -> str | None:
    """A warning when the ranks' threads outnumber the cores they could run on (the ``deepspeed`` launcher's rule
    gives each rank every physical core), or None.

    >>> launch = {"threads_per_rank": [2, 2], "affinity_per_rank": [[0, 1], [0, 1]], "launcher": "deepspeed"}
    >>> oversubscribed(launch).split(" (")[0], oversubscribed({**launch, "threads_per_rank": [1, 1]})
    ('oversubscribed: 2 ranks × 2 threads on 2 cores', None)
    """
    threads = [count for count in (launch or {}).get("threads_per_rank") or [] if count]
    cores = {core for affinity in (launch or {}).get("affinity_per_rank") or [] for core in affinity or []}
    if not threads or not cores or sum(threads) <= len(cores):
        return None
    return (
        f"oversubscribed: {len(threads)} ranks × {max(threads)} threads on {len(cores)} cores (the "
        f"{(launch or {}).get('launcher')} launcher's rule): the ranks' threads contend, so its speeds, and the "
        "winner they pick, may differ under a launch that gives each rank its own cores (--launcher-env torchrun, "
        "--bind-cores, or --launch-var OMP_NUM_THREADS=N)"
    )


def render_pruned(store: Store, study_id: int, console: Console, kinds: int = 5) -> None:
    """The pruned trials grouped by kind (memory · phase · largest category), each kind with one of its reasons."""
    from tuner.forecast import group_reasons

    pruned = store.trials(study_id, status="pruned")
    groups = group_reasons(trial.prune_reason for trial in pruned)
    if not groups:
        return
    console.print(f"pruned without a run: {len(pruned)}, by kind")
    for group in groups[:kinds]:
        example = "" if group.example == group.key else f" — e.g. {group.example}"  # a kind that is its reason
        console.print(f"  ×{group.count}  {group.key}{example}", highlight=False, soft_wrap=True, markup=False)
    if len(groups) > kinds:
        console.print(f"  … and {len(groups) - kinds} more kinds (the dashboard lists them all)", highlight=False)
