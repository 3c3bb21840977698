"""``dstune estimate --max-seq-len``: the longest sequence that fits the cluster (:func:`tuner.forecast.longest_fit`),
with the layout and config that reach it, the estimate of that config there and the next limit.

The flags given on the command line (``--stage``, ``--offload-optimizer``, ``--offload-param``,
``--activation-checkpointing``, ``--micro-batch``, ``--nvme-path``) and ``--ds-config`` (merged over every
candidate: ``sequence_parallel_size``, the ``dstune`` section's ``tiled_mlp_shards``, ``tiled_loss_shards``,
``offload_checkpoints``, a ZeRO stage...) pin what they set; the rest is searched. A transformers model is traced at
:data:`tuner.forecast.TRACE_LENGTHS` (from the profile cache when it holds them) and its profile extrapolated to the
lengths searched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from tuner.cli.common import fail, gib
from tuner.cli.options import WorkloadFlags, build, ds_config_file
from tuner.estimator import ConfigError, MemoryEstimate, estimate
from tuner.estimator.throughput import predict
from tuner.forecast import TRACE_LENGTHS, LongestFit, NoLengthFits, Pins, longest_fit
from tuner.space.dsconfig import merge_configs
from tuner.workload import TrialConfig, Workload

RenderEstimate = Callable[[MemoryEstimate, str, Console | None], None]  # tuner.cli.estimate.render
SequenceParallelOpt = Annotated[
    int | None, typer.Option(min=1, help="Ulysses degree (sequence_parallel_size); --max-seq-len: pins it.")
]
TiledMlpOpt = Annotated[int | None, typer.Option(min=1, help="ALST's tiled MLP shards (dstune.tiled_mlp_shards).")]
TiledLossOpt = Annotated[int | None, typer.Option(min=1, help="ALST's tiled loss shards (dstune.tiled_loss_shards).")]
OffloadCheckpointsOpt = Annotated[
    bool | None, typer.Option(help="Keep the checkpointed layer inputs in host memory (dstune.offload_checkpoints).")
]


@dataclass(frozen=True)
class LongContextFlags:
    """The long-context flags of ``dstune estimate`` (None: not given); ``--ds-config`` wins over them."""

    sequence_parallel: int | None = None
    tiled_mlp: int | None = None
    tiled_loss: int | None = None
    offload_checkpoints: bool | None = None

    def config(self) -> dict[str, object]:
        """The ds_config keys they set."""
        config: dict[str, object] = {}
        if self.sequence_parallel is not None:
            config["sequence_parallel_size"] = self.sequence_parallel
        alst = {
            key: value
            for key, value in (
                ("tiled_mlp_shards", self.tiled_mlp),
                ("tiled_loss_shards", self.tiled_loss),
                ("offload_checkpoints", self.offload_checkpoints),
            )
            if value is not None
        }
        if alst:
            config["dstune"] = alst
        return config

    def applied(self, workload: Workload, trial: TrialConfig) -> TrialConfig:
        """``trial`` with these settings under its ds_config (the file's keys win), checked by the estimator (bad
        input: one line naming the key, exit 2)."""
        extra = self.config()
        if not extra:
            return trial
        merged = TrialConfig(merge_configs(extra, trial.ds_config), trial.activation_checkpointing)
        try:
            estimate(workload, merged)
        except ConfigError as error:
            fail(error.field, error.message)
        return merged


NO_LENGTH_EXIT = 1  # a valid question whose answer is "nothing fits": not bad input


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the flag was set by the user (command line or environment), not left at its default."""
    source = ctx.get_parameter_source(name)  # typer may carry its own click: compared by name
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def pins_of(ctx: typer.Context, flags: WorkloadFlags, long: LongContextFlags | None = None) -> Pins:
    """The pins of the flags the user gave."""
    long = long or LongContextFlags()
    return Pins(
        sequence_parallel=long.sequence_parallel,
        tiled_mlp_shards=long.tiled_mlp,
        tiled_loss_shards=long.tiled_loss,
        offload_checkpoints=long.offload_checkpoints,
        stage=flags.stage if _given(ctx, "stage") else None,
        offload_optimizer=flags.offload_optimizer if _given(ctx, "offload_optimizer") else None,
        offload_param=flags.offload_param if _given(ctx, "offload_param") else None,
        activation_checkpointing=flags.activation_checkpointing if _given(ctx, "activation_checkpointing") else None,
        micro_batch=flags.micro_batch,
        ds_config=ds_config_file(flags.ds_config),
        nvme_path=flags.nvme_path,
    )


def traced_workload(flags: WorkloadFlags) -> Workload:
    """The workload of the flags with its profile traced at :data:`TRACE_LENGTHS` (one merged profile)."""
    works = [build(replace(flags, seq_len=length))[0] for length in TRACE_LENGTHS]
    profile = works[0].profile
    for work in works[1:]:
        if profile is not None and work.profile is not None:
            profile = profile.with_activations(work.profile.activations)
    return replace(works[-1], profile=profile)


def max_seq_len_command(
    ctx: typer.Context, flags: WorkloadFlags, long: LongContextFlags, as_json: bool, render: RenderEstimate
) -> None:
    """Answer ``--max-seq-len``: a table (then the estimate's, by ``render``), or the estimate's JSON with a
    ``max_seq_len`` object beside it."""
    if _given(ctx, "seq_len"):
        fail("seq-len", "not with --max-seq-len: the length is what it searches")
    pins = pins_of(ctx, flags, long)
    workload = traced_workload(flags)
    try:
        answer = longest_fit(workload, pins)
    except NoLengthFits as error:
        typer.echo(f"error: max-seq-len: {error}", err=True)
        raise typer.Exit(NO_LENGTH_EXIT) from None
    throughput = predict(answer.workload, answer.trial).to_dict()
    if as_json:
        body = {**answer.estimate.to_dict(), "throughput": throughput, "max_seq_len": answer.to_dict()}
        typer.echo(json.dumps(body))
        return
    render_longest(answer, workload.model.name, render)


def render_longest(answer: LongestFit, name: str, render: RenderEstimate, console: Console | None = None) -> None:
    """Print the answer as a table, its notes, then the estimate of its config at its length (``render``)."""
    console = console or Console()
    cluster = answer.workload.cluster
    layout = answer.trial.layout
    table = Table(title=f"{name}: the longest sequence on {cluster.world_size} × {gib(cluster.gpu_memory)} GiB")
    table.add_column("")
    table.add_column("", overflow="fold")
    limit = answer.next_limit
    rows = (
        ("longest sequence", f"{answer.seq_len:,} tokens (a multiple of {answer.multiple})"),
        ("layout", f"sp {layout.sequence_parallel} × dp {layout.data_parallel(cluster.world_size)}"),
        ("config", answer.trial.summary()),
        ("per GPU", f"{gib(answer.estimate.gpu_total)} GiB, {gib(answer.estimate.headroom)} GiB headroom"),
        ("predicted", f"{answer.tokens_per_s:,.0f} tokens/s" if answer.tokens_per_s else "unknown"),
        ("next limit", _limit_text(limit.seq_len, limit.memory, limit.category, limit.short_by)),
        ("searched", f"{answer.candidates} configs ({answer.refused} refused), {answer.estimates} estimates"),
    )
    for key, value in rows:
        table.add_row(key, value, style="bold" if key == "longest sequence" else None)
    console.print(table)
    for note in answer.notes():
        console.print(f"[yellow]note[/yellow]: {note}", highlight=False, soft_wrap=True)
    render(answer.estimate, f"its estimate at {answer.seq_len:,} tokens", console)


def _limit_text(seq_len: int, memory: str, category: str | None, short_by: int) -> str:
    if memory == "cap":
        return f"the search's cap ({seq_len:,} tokens)"
    if memory == "refused":
        return f"{seq_len:,} tokens refused by the estimator"
    return f"at {seq_len:,} tokens {memory.upper()} memory runs out ({category} grows most; {gib(short_by)} GiB short)"


__all__ = [
    "LongContextFlags",
    "OffloadCheckpointsOpt",
    "SequenceParallelOpt",
    "TiledLossOpt",
    "TiledMlpOpt",
    "pins_of",
    "render_longest",
    "traced_workload",
]
