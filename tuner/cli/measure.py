"""``dstune measure``: one short real DeepSpeed run in fresh rank processes; throughput and peak memory per rank."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tuner.cli.common import fail, memory_cap_bytes
from tuner.cli.local_gpu import checked_here
from tuner.cli.options import (
    AUTO_DEVICE,
    JsonOpt,
    StepsOpt,
    WarmupMaxOpt,
    WarmupOpt,
    WorkloadFlags,
    build,
    warmup_limit,
    workload_options,
)
from tuner.cli.script_model import no_model_workload, say_no_model, seq_len_known, without_model
from tuner.cli.script_options import (
    ArgMappingOpt,
    CommandArg,
    DsConfigAtOpt,
    script_command,
    script_flags,
    script_trial,
)
from tuner.cli.study_view import launch_lines
from tuner.measure.options import MEASURE_DEFAULTS, MeasureOptions
from tuner.requests import Launcher
from tuner.units import in_unit, memory_unit
from tuner.workload.measurable import measurement_refusal

if TYPE_CHECKING:
    from tuner.workload import TrialConfig, Workload


@workload_options(overrides=AUTO_DEVICE)
def measure_command(
    flags: WorkloadFlags,
    warmup: WarmupOpt = MEASURE_DEFAULTS.warmup,
    warmup_max: WarmupMaxOpt = None,
    steps: StepsOpt = MEASURE_DEFAULTS.steps,
    timeout: Annotated[
        float, typer.Option(min=1, help="Seconds before every rank is killed.")
    ] = MEASURE_DEFAULTS.timeout,
    launcher: Annotated[Launcher, typer.Option(help="Start ranks on this machine or through Ray.")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="Existing Ray cluster (with --launcher ray).")] = None,
    memory_cap: Annotated[str | None, typer.Option(help="Address-space cap per rank (CPU runs).")] = None,
    as_json: JsonOpt = False,
    ds_config_at: DsConfigAtOpt = None,
    arg_mapping: ArgMappingOpt = None,
    command: CommandArg = None,
) -> None:
    """Run a short real DeepSpeed training job and report throughput and peak memory per rank. After --: your own
    training command, measured with its own ds_config."""
    warmup_max = warmup_limit(warmup, warmup_max)
    flags = checked_here(flags, launcher, ray_address)  # before the workload is built (it loads the model)
    script = script_command(command, ds_config_at, arg_mapping)
    if script is not None:
        flags = script_flags(flags, script)
    if script is not None and without_model(flags):
        say_no_model()
        workload, trial = no_model_workload(flags, script)
    else:
        workload, trial = build(flags)
    if script is not None:
        trial = script_trial(script, flags, workload.cluster.world_size)
    refusal = measurement_refusal(workload) if script is None else None  # a command trains its own model
    if refusal:
        fail(*refusal)
    cap = memory_cap_bytes(memory_cap, flags.device)
    from tuner.measure.run import measure

    if not as_json and (launcher == "local" or ray_address is None):  # the ranks build DeepSpeed's ops here
        from tuner.measure.op_builds import build_notice, build_ops

        notice, ops = build_notice(workload.cluster.device, [trial.ds_config])
        if notice:
            Console().print(notice, highlight=False, soft_wrap=True, markup=False)
            build_ops(ops)  # outside the run's --timeout
    options = MeasureOptions(
        launcher, ray_address, warmup, steps, timeout, cap, warmup_max, script, seq_len_known(flags)
    )
    result = measure(workload, trial, options, show_progress=not as_json)
    over = over_memory(workload, trial, result) if script is None else None
    if as_json:
        typer.echo(json.dumps({**result, "over_memory": over}))
    else:
        render_measurement(result, budget=workload.cluster.gpu_memory)
        if over:
            Console().print(f"over the memory: {over} (a study records this run oom)", highlight=False, soft_wrap=True)
    raise typer.Exit(0 if result["status"] == "ok" else 1)


def over_memory(workload: Workload, trial: TrialConfig, result: dict[str, Any]) -> str | None:
    """Why a run that trained does not fit ``--gpu-memory`` as a study judges it (its peak less, on CPU ranks, the
    states a GPU would offload to the host), or None: CPU ranks train past any budget, so ``ok`` alone does not say."""
    from tuner.estimator import estimate
    from tuner.study import measured_over

    peak = max((b for b in result.get("peak_bytes_per_rank") or [] if b is not None), default=None)
    if result["status"] != "ok" or peak is None:
        return None
    cluster = workload.cluster
    host = estimate(workload, trial).host_states_per_rank(cluster.gpus_per_node) if cluster.device == "cpu" else 0
    return measured_over(peak, cluster.gpu_memory, host, whose="given")


def render_measurement(result: dict[str, Any], console: Console | None = None, budget: int | None = None) -> None:
    """Print a measured run: status, throughput, step times, peak memory per rank against the estimate (sizes in
    MiB under a GPU memory ``budget`` below 1 GiB, else GiB; the budget defaults to the estimate's)."""
    console = console or Console()
    unit, scale = memory_unit(budget or (result.get("estimate") or {}).get("gpu_memory") or 0)
    size = functools.partial(in_unit, unit=(unit, scale))
    status = result["status"]
    console.print(f"status: [{'green' if status == 'ok' else 'red'}]{status}[/]")
    if result["error"]:
        console.print(result["error"].strip().splitlines()[-1], highlight=False, soft_wrap=True, markup=False)
    if status == "ok":
        steps = result["step_time_s"]
        tokens = result["tokens_per_s"]
        per_s = (
            f"{tokens:,.0f} tokens/s, " if tokens is not None else ""
        ) + f"{result['samples_per_s']:,.2f} samples/s"
        console.print(f"throughput: {per_s}")
        console.print(f"step time: p50 {steps['p50']:.3f} s, p90 {steps['p90']:.3f} s")
        if result["tflops_per_device"] is not None:  # none without a model description (a command's own model)
            console.print(f"model TFLOP/s per device: {result['tflops_per_device']:.4f}")
    table = Table()
    for name in ("rank", "host", "node rank", "local rank", "status"):
        table.add_column(name)
    table.add_column(f"peak {unit}", justify="right")
    table.add_column(f"peak RSS {unit}", justify="right")
    for rank in result.get("ranks") or []:
        where = [rank.get("hostname") or "-", *(str(rank.get(k, "-")) for k in ("node_rank", "local_rank"))]
        peaks = (size(rank.get("peak_bytes")), size(rank.get("peak_rss_bytes")))
        table.add_row(str(rank["rank"]), *where, rank["status"], *peaks)
    console.print(table)
    for line in launch_lines("launch: ", result.get("launch")):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    script = result.get("script") or {}
    if script:
        console.print(
            f"the figures are your command's: {script['command']}", highlight=False, soft_wrap=True, markup=False
        )
    if result.get("estimate"):
        console.print(f"estimated peak per GPU: {size(result['estimate']['per_gpu']['total'])} {unit}")
    if result.get("estimate_assumes"):  # without an estimate, why there is none
        assumes = result["estimate_assumes"]
        line = f"the estimate assumes {assumes}" if result.get("estimate") else assumes
        console.print(line, highlight=False, soft_wrap=True, markup=False)
