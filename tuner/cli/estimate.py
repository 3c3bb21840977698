"""``dstune estimate``: peak memory per GPU and per node's CPU for one workload and ds_config, as a table or JSON;
with ``--max-seq-len``, the longest sequence that fits (:mod:`tuner.cli.max_seq_len`)."""

from __future__ import annotations

import functools
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuner.cli.common import fail
from tuner.cli.max_seq_len import max_seq_len_command
from tuner.cli.options import JsonOpt, WorkloadFlags, build, workload_options
from tuner.estimator import MemoryEstimate, estimate, predict
from tuner.forecast import DEFAULT_MARGIN
from tuner.units import in_unit, memory_unit, parse_fraction

MaxSeqLenOpt = Annotated[
    bool,
    typer.Option(
        "--max-seq-len",
        help="Answer the longest sequence that fits, and the layout and config that reach it (flags given pin "
        "what they set; the rest is searched).",
    ),
]

ROWS = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_states", "optimizer states"),
    ("activations", "activations"),
    ("buffers", "buffers"),
    ("overhead", "overhead"),
    ("total", "total"),
)


def render(est: MemoryEstimate, title: str, console: Console | None = None) -> None:
    """Print an estimate as a table of per-GPU categories, the CPU total, peak phase and verdict: sizes in MiB under
    a budget below 1 GiB (GPU memory for the GPU's, CPU memory for the CPU's), else GiB."""
    console = console or Console()
    console.print(title, highlight=False, markup=False)
    unit, cpu_unit = memory_unit(est.gpu_memory), memory_unit(est.cpu_memory)
    gpu = functools.partial(in_unit, unit=unit)
    table = Table()
    table.add_column("per GPU")
    table.add_column(unit[0], justify="right")
    for key, label in ROWS:
        table.add_row(label, gpu(est.per_gpu.get(key)), style="bold" if key == "total" else None)
        if key == "overhead":  # its named CUDA terms (context, NCCL per communicator, cuBLAS, allocator reserve)
            for term, size in est.overhead_terms.items():
                table.add_row(f"  {term.replace('_', ' ')}", gpu(size), style="dim")
    console.print(table)
    cpu = [in_unit(size, cpu_unit) for size in (est.cpu_per_node["total"], est.cpu_memory)]
    console.print(f"CPU per node: {cpu[0]} {cpu_unit[0]} of {cpu[1]} {cpu_unit[0]}")
    console.print(f"peak phase: {est.peak_phase}")
    if est.estimate_only:
        console.print(f"[yellow]ESTIMATE ONLY[/yellow]: {escape(est.estimate_only)}", highlight=False, soft_wrap=True)
    if est.fits:
        console.print(
            f"[green]FITS[/green] with {gpu(est.headroom)} {unit[0]} headroom per GPU "
            f"(of {gpu(est.gpu_memory)} {unit[0]})"
        )
    else:
        console.print(
            f"[red]DOES NOT FIT[/red]: {escape(est.overflow_reason() or '')}", highlight=False, soft_wrap=True
        )


def margin_of(text: str | None) -> float:
    """``5%`` or ``0.05`` as a fraction in [0, 0.5); exits 2 naming ``margin`` otherwise.

    >>> margin_of("5%"), margin_of("0"), margin_of(None) == DEFAULT_MARGIN
    (0.05, 0.0, True)
    """
    if text is None:
        return DEFAULT_MARGIN
    try:
        value = parse_fraction(text)
    except ValueError as error:
        fail("margin", str(error))
    if not 0 <= value < 0.5:
        fail("margin", f"must be at least 0 and below 50%, got {text!r}")
    return value


@workload_options()
def estimate_command(
    ctx: typer.Context,
    flags: WorkloadFlags,
    max_seq_len: MaxSeqLenOpt = False,
    as_json: JsonOpt = False,
    out: Annotated[
        str | None, typer.Option(help="With --max-seq-len: write the answer's ds_config to this file.")
    ] = None,
    margin: Annotated[
        str | None,
        typer.Option(
            help="With --max-seq-len: the share of the estimated GPU peak kept free beside it, 5% or 0.05; 0: the "
            f"estimate's own limit (default {DEFAULT_MARGIN:.0%}, as the API's seq_len max answers)."
        ),
    ] = None,
) -> None:
    """Estimate peak memory per GPU and per node's CPU for one training configuration."""
    if max_seq_len:
        max_seq_len_command(ctx, flags, as_json, render, out, margin_of(margin))
        return
    for name, given in (("out", out), ("margin", margin)):
        if given is not None:
            fail(name, "only with --max-seq-len (an estimate of one length writes no config)")
    workload, trial = build(flags)
    est = estimate(workload, trial)
    throughput = predict(workload, trial).to_dict()  # the hardware table's constants: no store here
    if as_json:
        typer.echo(json.dumps({**est.to_dict(), "throughput": throughput}))
    else:
        spec = workload.model
        architecture = f" ({est.architecture})" if est.architecture and est.architecture != "params" else ""
        trains = f" ({est.trainable_params:,} trainable)" if est.trainable_params is not None else ""
        render(
            est,
            f"{spec.name}{architecture}: {est.n_params:,} parameters{trains}, {workload.cluster.world_size} GPU(s)",
        )
        typer.echo(
            f"predicted: {throughput['tokens_per_s']:,.0f} tokens/s, {throughput['step_time_s']:.3g} s per step "
            f"({throughput['bound']}-bound; {throughput['hardware']} table constants, not fitted to runs)"
        )
