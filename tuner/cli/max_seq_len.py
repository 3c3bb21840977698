"""``dstune estimate --max-seq-len``: the longest sequence that fits the cluster (:func:`tuner.forecast.longest_fit`),
with the layout and config that reach it, the estimate of that config there and the next limit.

The flags given on the command line (``--stage``, ``--offload-optimizer``, ``--offload-param``,
``--activation-checkpointing``, ``--micro-batch``, ``--nvme-path``, the numerics flags, ``--tensor-parallel``,
``--expert-parallel``, ``--hpz``) and ``--ds-config`` (merged over every candidate, as the API's ``seq_len: "max"``
merges them: :func:`tuner.requests.search_pins.pinned_sections`; ``sequence_parallel_size``, the ``dstune``
section's ``tiled_mlp_shards``, ``tiled_loss_shards``, ``offload_checkpoints``, a ZeRO stage...) pin what they set;
the rest is searched. A transformers model is traced at :data:`tuner.forecast.TRACE_LENGTHS` (from the profile cache
when it holds them), in the precision the pinned config trains in, and its profile extrapolated to the lengths
searched.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tuner.cli.answer_flags import again_flags, again_line
from tuner.cli.common import fail, gib, write_text_file
from tuner.cli.options import WorkloadFlags, build, ds_config_file
from tuner.cli.out_guard import refuse_database_out
from tuner.estimator import MemoryEstimate, predict
from tuner.forecast import DEFAULT_MARGIN, TRACE_LENGTHS, LongestFit, NoLengthFits, Pins, longest_fit
from tuner.requests import TrialSettings
from tuner.requests.search_pins import PINNED_LAYOUTS, pinned_sections
from tuner.space.dsconfig import export_config
from tuner.space.training_code import training_code, training_code_path
from tuner.units import format_bytes
from tuner.workload import Workload
from tuner.workload.layouts import ULYSSES

RenderEstimate = Callable[[MemoryEstimate, str, Console | None], None]  # tuner.cli.estimate.render
CHECKPOINTING = "activation checkpointing: model.gradient_checkpointing_enable() before deepspeed.initialize"
CONFIG_NAME = "ds_config.json"  # the printed config's name in the flags that use it again, without --out
ARCTIC_KEYS = ("sequence_parallel_size", "activation_checkpoint_cpu_offload", "tiled_mlp_compute")
NO_LENGTH_EXIT = 1  # a valid question whose answer is "nothing fits": not bad input


def flag_given(ctx: typer.Context, name: str) -> bool:
    """Whether the flag was set by the user (command line or environment), not left at its default."""
    source = ctx.get_parameter_source(name)  # typer may carry its own click: compared by name
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def pins_of(ctx: typer.Context, flags: WorkloadFlags) -> Pins:
    """The pins of the flags the user gave (the long-context ones included: ``--sequence-parallel``...)."""

    def pinned(name: str) -> Any:
        return flags.value(name) if flag_given(ctx, name) else None

    return Pins(
        sp=pinned(ULYSSES.parameter),
        tiled_mlp_shards=pinned("tiled_mlp"),
        tiled_loss_shards=pinned("tiled_loss"),
        offload_checkpoints=pinned("offload_checkpoints"),
        stage=pinned("stage"),
        offload_optimizer=pinned("offload_optimizer"),
        offload_param=pinned("offload_param"),
        activation_checkpointing=pinned("activation_checkpointing"),
        micro_batch=flags.micro_batch,
        ds_config=pinned_sections(_settings(flags)),
        nvme_path=flags.nvme_path,
    )


def _settings(flags: WorkloadFlags) -> TrialSettings:
    """The flags' trial fields the search does not vary (checked by :func:`build` already)."""
    numerics = ("bf16_master_weights", "bf16_optimizer_states", "optimizer", "chunked_loss", "liger")
    layouts = {name: flags.layouts[name] or 1 for name in PINNED_LAYOUTS}
    given = {name: getattr(flags, name) for name in numerics}
    return TrialSettings.model_validate({**given, **layouts, "ds_config": ds_config_file(flags.ds_config)})


def traced_workload(flags: WorkloadFlags) -> Workload:
    """The workload of the flags (at the longest of :data:`TRACE_LENGTHS`) with its profile traced at every one of
    them, together: each checkpointing setting's copy of the model is built once for the three lengths."""
    return build(replace(flags, seq_len=TRACE_LENGTHS[-1]), lengths=TRACE_LENGTHS)[0]


def max_seq_len_command(
    ctx: typer.Context,
    flags: WorkloadFlags,
    as_json: bool,
    render: RenderEstimate,
    out: str | None = None,
    margin: float = DEFAULT_MARGIN,
) -> None:
    """Answer ``--max-seq-len``: a table (then the estimate's, by ``render``, and the config to train with), or the
    estimate's JSON with a ``max_seq_len`` object and the ``export`` beside it; ``out``: the config written there, the
    code-side settings beside it (:func:`training_code_path`). ``margin``: the fraction of the estimated GPU peak the
    answer keeps free on top of it (:data:`DEFAULT_MARGIN`, as the API's ``seq_len: "max"`` answers)."""
    if flag_given(ctx, "seq_len"):
        fail("seq-len", "not with --max-seq-len: the length is what it searches")
    for path in (out, training_code_path(out)) if out else ():
        refuse_database_out(path)  # before the search: a script or a database named by mistake stays whole
    pins = pins_of(ctx, flags)
    workload = traced_workload(flags)
    try:
        answer = longest_fit(workload, pins, margin)
    except NoLengthFits as error:
        typer.echo(f"error: max-seq-len: {error}", err=True)
        raise typer.Exit(NO_LENGTH_EXIT) from None
    throughput = predict(answer.workload, answer.trial).to_dict()
    config, notes, code = answer_export(answer, out)
    if out:
        write_text_file(out, json.dumps(config, indent=2) + "\n")
        write_text_file(training_code_path(out), json.dumps(code, indent=2) + "\n")
    if as_json:
        export = {"ds_config": config, "notes": notes, "training_code": code, "margin": margin}
        body = {**answer.estimate.to_dict(), "throughput": throughput, "max_seq_len": answer.to_dict()}
        typer.echo(json.dumps({**body, "export": export}))
        return
    console = Console()
    render_longest(answer, workload.model.name, render, console)
    kept = f"{margin:.0%} of the estimated peak kept free beside it" if margin else "none: the estimate's own limit"
    console.print(f"margin: {kept} (--margin; default {DEFAULT_MARGIN:.0%})", highlight=False)
    render_export(config, notes, out, console)
    arctic = code["arctic_training"]
    keys = ", ".join(f"{key}: {json.dumps(arctic[key])}" for key in ARCTIC_KEYS)
    console.print(f"with ArcticTraining: {keys}, data.max_length: {answer.seq_len} (the ds_config as its deepspeed "
                  "section)", highlight=False, markup=False, soft_wrap=True)  # fmt: skip
    saved = "" if out else f" (the config above saved as {CONFIG_NAME})"
    console.print(f"estimate or measure it again with{saved}: {code['again']}", highlight=False, markup=False,
                  soft_wrap=True)  # fmt: skip


def answer_export(answer: LongestFit, out: str | None) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """The answer's ds_config as DeepSpeed takes it, the notes that go with it and the code-side settings
    (:func:`training_code`, with ``again``: the flags that estimate or measure it again from ``out``)."""
    config, notes = export_config(
        answer.trial, "deepspeed", answer.workload.train.attention, answer.workload.trainable, answer.seq_len
    )
    if answer.trial.activation_checkpointing:  # a model setting: no ds_config key says it
        notes.insert(0, CHECKPOINTING)
    code = training_code(answer.trial, notes, answer.seq_len, out or "the ds_config")
    code["again"] = again_line(again_flags(answer.trial, answer.seq_len, out or CONFIG_NAME))
    return config, notes, code


def render_export(config: dict[str, Any], notes: list[str], out: str | None, console: Console) -> None:
    """The answer's ds_config as DeepSpeed takes it (written to ``out`` when given), and what the training code must
    apply beside it: the ``dstune`` keys of the answer (ALST's tiled MLP and loss, checkpoint offload) are not
    DeepSpeed's, so they are left out of the config and said here."""
    if out:
        console.print(f"wrote {out}: the ds_config to train with (DeepSpeed keys only)", highlight=False, markup=False,
                      soft_wrap=True)  # fmt: skip
        console.print(f"wrote {training_code_path(out)}: what the training code applies beside it (the steps "
                      "below, and their values)", highlight=False, markup=False, soft_wrap=True)  # fmt: skip
    else:
        console.print("the ds_config to train with:", highlight=False)
        console.print_json(json.dumps(config))
    if notes:
        console.print("the training code applies, beside it (not DeepSpeed keys):", highlight=False)
    for note in notes:
        console.print(f"- {note}", highlight=False, soft_wrap=True, markup=False)


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
        ("layout", f"sp {layout.degree(ULYSSES)} × dp {layout.data_parallel(cluster.world_size)}"),
        ("config", answer.trial.summary()),
        ("per GPU", f"{gib(answer.estimate.gpu_total)} GiB, {gib(answer.estimate.headroom)} GiB headroom"),
        ("predicted", f"{answer.tokens_per_s:,.0f} tokens/s" if answer.tokens_per_s else "unknown"),
        ("next limit", _limit_text(limit.seq_len, limit.memory, limit.category, limit.short_by, limit.reason)),
        ("searched", f"{answer.candidates} configs ({answer.refused} refused), {answer.estimates} estimates"),
    )
    for key, value in rows:
        table.add_row(key, value, style="bold" if key == "longest sequence" else None)
    console.print(table)
    for note in answer.notes():
        console.print(f"[yellow]note[/yellow]: {escape(note)}", highlight=False, soft_wrap=True)
    render(answer.estimate, f"its estimate at {answer.seq_len:,} tokens", console)


def _limit_text(seq_len: int, memory: str, category: str | None, short_by: int, reason: str = "") -> str:
    if memory == "cap":
        return f"the search's cap ({seq_len:,} tokens)"
    if memory == "positions":
        return f"the model's learned position table: {reason}"
    if memory == "refused":
        return f"{seq_len:,} tokens refused by the estimator"
    if memory == "gpu" and not reason.startswith("GPU memory short"):  # it holds the peak, not the margin
        return f"at {seq_len:,} tokens {reason} ({category} grows most)"
    why = reason.partition("; ")[2]  # beyond the overflow itself (a pinned buffer that doubles, the margin)
    short = format_bytes(short_by)
    text = f"at {seq_len:,} tokens {memory.upper()} memory runs out ({category} grows most; {short} short)"
    return text + (f": {why}" if why else "")


__all__ = [
    "flag_given",
    "max_seq_len_command",
    "pins_of",
    "render_longest",
    "traced_workload",
]
