"""``dstune tune --seq-len max``: the longest sequence that fits, found by measurement.

The estimator answers first (:func:`tuner.forecast.longest_fit`, as ``dstune estimate --max-seq-len``): its length
is where measuring starts, and its layout and config (Ulysses degree, ZeRO stage, checkpointing, tiling) are what is
measured at every length. Measured runs then gallop and bisect the length (:func:`tuner.study.search_length`) until
a length measured within ``--gpu-memory`` and the next one measured over it (or the search's cap) are one step apart
(256 tokens, or what the layout requires). Each length is recorded in its own study, ``NAME:LENGTH``
(:class:`tuner.study.LengthRuns`); ``--trials`` caps the runs. Running the command again reuses what was measured.

What it pins: ``--sequence-parallel``, ``--tiled-mlp``, ``--tiled-loss``, ``--offload-checkpoints`` and ``--pin``
of ``stage``, ``activation_checkpointing`` or ``micro_batch``; the rest is the estimator's choice. On CPU ranks the
rank's memory is both the device and the host, so nothing is offloaded (offloaded states would still count in the
measured peak) and checkpoint offload, which needs CUDA, is left out. Flags it cannot honour (a global batch, a
space, a sampler...) are refused in one line naming the flag, exit 2.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from tuner.cli.common import fail
from tuner.cli.max_seq_len import flag_given, traced_workload
from tuner.cli.options import WorkloadFlags
from tuner.forecast import SEARCH_CAP, SEQ_MULTIPLE, LongestFit, NoLengthFits, Pins, SeqSizer, longest_fit
from tuner.measure.long_context_checks import measured_refusal
from tuner.measure.options import MeasureOptions
from tuner.units import format_bytes
from tuner.workload.layouts import AUTOTP, HPZ, ULYSSES
from tuner.workload.measurable import measurement_refusal

if TYPE_CHECKING:
    from tuner.study import LengthSearch, Measurer, Probe
    from tuner.workload import Workload

MAX = "max"
# tune's flags that have no meaning for a search over the length (it measures one config per length)
UNHONOURED = {
    "global_batch": ("global-batch", "the length search runs micro-batch 1 and no accumulation (--pin micro_batch=N)"),
    "space": ("space", "the length search measures the estimator's config, not a space's"),
    "sampler": ("sampler", "the length search bisects the length; no sampler proposes configs"),
    "pareto": ("pareto", "the length search has one objective: the longest length"),
    "seed": ("seed", "the length search samples nothing"),
    "timeout": ("timeout", "the length search is bounded by --trials (runs) and --run-timeout"),
    "search_threads": ("search-threads", "the length search measures one config per length"),
    "cores_per_node": ("cores-per-node", "the length search measures one config per length"),
    AUTOTP.parameter: ("tensor-parallel", "the length search considers Ulysses layouts, not AutoTP"),
    HPZ.parameter: ("hpz", "the length search considers Ulysses layouts, not hpZ groups"),
    "allow_numerics_changes": ("allow-numerics-changes", "the length search measures the estimator's config"),
}
PINNABLE = ("stage", "activation_checkpointing", "micro_batch")  # the --pin names it honours


@dataclass(frozen=True)
class SearchOptions:
    """What ``tune`` passes on: the runs' options, the study's name and store, the most runs, ``--pin`` parsed."""

    dispatch: MeasureOptions
    study: str | None
    storage: str | None
    runs: int
    pins: dict[str, Any]
    nvme_path: str | None


def seq_len_of(text: str) -> int | None:
    """``--seq-len`` of ``tune``: a positive integer, or None for ``max`` (exit 2 otherwise)."""
    if text.strip().lower() == MAX:
        return None
    try:
        value = int(text)
    except ValueError:
        fail("seq-len", f"expected a positive integer or max, got {text!r}")
    if value < 1:
        fail("seq-len", f"must be at least 1, got {value}")
    return value


def tune_max(ctx: typer.Context, flags: WorkloadFlags, options: SearchOptions) -> int:
    """Run the length search (module docstring) and print it; 0 when a length was measured to fit, else 1."""
    for name, (flag, why) in UNHONOURED.items():
        if flag_given(ctx, name):
            fail(flag, f"not with --seq-len max: {why}")
    check_pins(options.pins)
    # checkpoint offload is a pin of the candidates, not of the flags' own trial (tune has no checkpointing flag)
    workload = traced_workload(replace(flags, seq_len=SEQ_MULTIPLE, offload_checkpoints=False))
    refusal = measurement_refusal(replace(workload, train=replace(workload.train, seq_len=SEQ_MULTIPLE)))
    if refusal:
        fail(*refusal)
    pins = search_pins(flags, options, workload)
    cap = search_cap(workload)
    try:
        answer = longest_fit(workload, pins, cap=cap)
    except NoLengthFits as error:
        typer.echo(f"error: seq-len: the estimator finds no length that fits: {error}", err=True)
        return 1
    answer = _within_host(workload, pins, cap, options, answer)
    base = _base_name(options.study, workload, cap)
    refused = measured_refusal(answer.workload, answer.trial, workload.cluster.device)
    if refused:
        fail(*refused)
    console = Console()
    console.print(
        f"estimate: {answer.seq_len:,} tokens with {answer.trial.summary()}; measuring from there in steps of "
        f"{answer.multiple} (at most {options.runs} runs), each length recorded as study {base}:LENGTH",
        highlight=False,
        soft_wrap=True,
    )
    started = time.monotonic()
    found = _measure(workload, answer, pins, base, cap, options, console)
    render_search(found, answer, workload, console, time.monotonic() - started)
    return 0 if found.longest is not None else 1


def _within_host(workload: Workload, pins: Pins, cap: int, options: SearchOptions, answer: LongestFit) -> LongestFit:
    """CPU ranks on this host: the search starts at the longest length that fits the host, when that is shorter
    (``--gpu-memory`` may say more than the host holds; a run past the host is refused:
    tuner.measure.driver.host_memory). The ranks' share and the node's part compete for the one memory: the share
    shrinks until both fit."""
    from tuner.measure.driver.host_memory import available_memory, host_bytes, host_share

    if options.dispatch.launcher != "local" and options.dispatch.ray_address is not None:
        return answer
    available = budget = available_memory()
    for _ in range(HOST_TRIES):
        shared = host_share(workload, budget)
        if shared is None:
            return answer
        try:
            within = longest_fit(shared, pins, cap=cap)
        except NoLengthFits:
            return answer
        need = host_bytes(within.workload, within.estimate)
        if need <= available:
            break
        budget = budget * available // need - (need - available)  # past the steps a length moves in
    else:
        return answer
    if within.seq_len >= answer.seq_len:
        return answer
    typer.echo(
        f"note: {answer.seq_len:,} tokens would need more memory than this host has for "
        f"{workload.cluster.world_size} CPU ranks ({format_bytes(available)} available); starting from "
        f"{within.seq_len:,}",
        err=True,
    )
    return within


def check_pins(pins: dict[str, Any]) -> None:
    """``--pin`` names and values the length search honours (exit 2 naming ``pin`` otherwise)."""
    unknown = sorted(set(pins) - set(PINNABLE))
    if unknown:
        fail("pin", f"{unknown[0]}: not with --seq-len max, which pins {', '.join(PINNABLE)}")
    for name, value in pins.items():
        whole = isinstance(value, int) and not isinstance(value, bool)
        good, expected = {
            "stage": (whole and value in (0, 1, 2, 3), "0, 1, 2 or 3"),
            "activation_checkpointing": (isinstance(value, bool), "true or false"),
            "micro_batch": (whole and value >= 1, "a positive integer"),
        }[name]
        if not good:
            fail("pin", f"{name}={value!r}: expected {expected}")


def search_pins(flags: WorkloadFlags, options: SearchOptions, workload: Workload) -> Pins:
    """The pins of the flags and ``--pin`` (:func:`check_pins`), and what measured runs impose: no offload on CPU
    ranks, no Ulysses or tiling for the built-in model."""
    pinned = options.pins
    cpu = workload.cluster.device == "cpu"
    builtin = workload.model.implementation != "transformers"
    return Pins(
        stage=pinned.get("stage"),
        activation_checkpointing=pinned.get("activation_checkpointing"),
        micro_batch=int(pinned.get("micro_batch") or 1),
        offload_optimizer="none" if cpu else None,
        offload_param="none" if cpu else None,
        sp=flags.layouts[ULYSSES.field] or (1 if builtin else None),
        tiled_mlp_shards=flags.tiled_mlp or (1 if builtin else None),
        tiled_loss_shards=flags.tiled_loss or (1 if builtin else None),
        offload_checkpoints=flags.offload_checkpoints
        if flags.offload_checkpoints is not None
        else (False if cpu or builtin else None),
        nvme_path=options.nvme_path,
    )


def search_cap(workload: Workload) -> int:
    """The longest length searched: the model's learned position table where it has one, else the estimator's
    search cap."""
    limit = workload.model.position_limit
    return min(SEARCH_CAP, limit) if limit > 0 else SEARCH_CAP


HOST_TRIES = 6  # shares tried for a length search's start on CPU ranks (_within_host)


def _base_name(study: str | None, workload: Workload, cap: int) -> str:
    from tuner.study import default_base_name, longest_name_fits

    base = study or default_base_name(workload)
    if not longest_name_fits(base, cap):
        fail("study", f"{base!r}: each length is recorded as NAME:LENGTH, which must follow the study-name rule")
    return base


def _measure(
    workload: Workload, answer: LongestFit, pins: Pins, base: str, cap: int, options: SearchOptions, console: Console
) -> LengthSearch:
    """The search's runs through the dispatcher, each probe printed as it ends."""
    from tuner.env import storage_url
    from tuner.measure.dispatch import Dispatcher
    from tuner.measure.op_builds import announced
    from tuner.storage import Store
    from tuner.study import LengthRuns, search_length

    cluster, dispatch = workload.cluster, options.dispatch
    store = Store.open(storage_url(options.storage))
    dispatcher = Dispatcher(dispatch, cluster.device, cluster.world_size)
    measurer: Measurer = announced(
        dispatcher, dispatch, lambda line: console.print(line, highlight=False, markup=False)
    )
    sizer = SeqSizer(workload, (answer.candidate.sp,))

    def said(probe: Probe) -> None:
        console.print(f"  {_probe_line(probe, cluster.gpu_memory)}", highlight=False, soft_wrap=True)

    runs = LengthRuns(store, base, sizer, answer.candidate, pins, measurer, on_probe=said)
    try:
        return search_length(answer.seq_len, answer.multiple, cap, runs, options.runs)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: what finished is recorded; run the same command to go on")
        raise typer.Exit(1) from None
    finally:
        dispatcher.close(wait=False)


def _mib(size: int | None) -> str:
    return "?" if size is None else format_bytes(size)


def _probe_line(probe: Probe, memory: int) -> str:
    details = probe.details
    peak, estimated = details.get("peak"), details.get("estimate")
    shown = f"{probe.seq_len:,} tokens: {probe.verdict}"
    if peak is not None:
        shown += f", measured peak {_mib(peak)} of {_mib(memory)}"
    if estimated is not None:
        shown += f" (estimated {_mib(estimated.gpu_total)})"
    if details.get("reused"):
        shown += ", recorded before"
    if probe.verdict == "failed":
        shown += f": {probe.note}"
    return shown


def render_search(found: LengthSearch, answer: LongestFit, workload: Workload, console: Console, wall: float) -> None:
    """The probes by length, then the answer: the longest length measured to fit, its config and study, and what
    bounds it from above."""
    memory = workload.cluster.gpu_memory
    table = Table(title=f"{workload.model.name}: lengths measured on {workload.cluster.world_size} rank(s)")
    for column in ("tokens", "status", "measured peak", "estimated", "tokens/s", "study"):
        table.add_column(column, justify="right" if column not in ("status", "study") else "left")
    for probe in sorted(found.probes, key=lambda p: p.seq_len):
        details = probe.details
        estimated = details.get("estimate")
        tokens = details.get("tokens_per_s")
        table.add_row(
            f"{probe.seq_len:,}",
            str(details.get("status", probe.verdict)),
            _mib(details.get("peak")),
            _mib(estimated.gpu_total if estimated is not None else None),
            f"{tokens:,.0f}" if tokens else "",
            str(details.get("study", "")),
        )
    console.print(table)
    for line in summary_lines(found, answer, memory, wall):
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def summary_lines(found: LengthSearch, answer: LongestFit, memory: int, wall: float) -> list[str]:
    """The answer in words: the longest measured fit and its config, its upper bound, runs and time."""
    runs = f"{found.runs} measured lengths, {wall:.0f} s"
    if found.longest is None:
        return [f"no length measured to fit {_mib(memory)} ({found.ended}; {runs})", *_failure(found)]
    best = found.probe(found.longest)
    details = best.details if best is not None else {}
    config = details["trial"].summary() if "trial" in details else answer.trial.summary()
    bounds = {
        "bracketed": f"{found.above:,} tokens measured over it" if found.above else "",
        "cap": f"the search's cap ({found.cap:,} tokens)",
        "budget": "not bracketed: out of runs (--trials)" + (f"; {found.above:,} measured over" if found.above else ""),
        "failed": "not bracketed: a run failed",
        "floor": "",
    }
    lines = [
        f"longest measured: {found.longest:,} tokens ({config}); above it: {bounds[found.ended]}",
        f"estimated {answer.seq_len:,}; {runs}; export: dstune best --study {details.get('study', '?')}",
    ]
    return lines + _failure(found)


def _failure(found: LengthSearch) -> list[str]:
    failed = [p for p in found.probes if p.verdict == "failed"]
    return [f"run at {p.seq_len:,} tokens: {p.note}" for p in failed]


__all__ = [
    "MAX",
    "SearchOptions",
    "check_pins",
    "render_search",
    "search_cap",
    "search_pins",
    "seq_len_of",
    "summary_lines",
    "tune_max",
]
