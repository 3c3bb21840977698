"""Saved activations traced from the real transformers model under fake tensors (imports torch and transformers).

A copy of the model holding the first two layers of each layer kind (:mod:`tuner.profile.small_copy`) runs its
forward pass under PyTorch's ``FakeTensorMode`` (shapes and dtypes only: no memory, no arithmetic) at micro-batch 1,
2 and 3; what autograd saves is counted by decoder layer (:mod:`tuner.profile.autograd_saved`) and fitted into an
:class:`ActivationProfile` (bytes linear in the micro-batch, per layer kind).

Pitfalls: the MoE experts implementation is the one training runs (transformers' default); the
``meta`` device is not fake mode. Composite models (Gemma-3, Qwen3.5...) are traced whole, their text config's
decoder layers standing for the layer kinds. Recurrent models (their layers step through the sequence, so a trace's
cost grows with its length) are traced at short lengths and extrapolated where exactly linear (:func:`_traced_parts`).
A forward pass whose ops read tensors' values (``.item()``, ``nonzero``), which fake tensors cannot run, is traced on
real CPU tensors with random weights where the copy is small enough and its layers are one list (:func:`_next_attempt`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode

from tuner.profile.autocast_trace import traced_autocast
from tuner.profile.autograd_saved import OUTSIDE, saved_bytes_by_layer, zero3_linear
from tuner.profile.hf import hf_config
from tuner.profile.model_parts import config_value, depth_field, kind_runs, text_config
from tuner.profile.quiet_logs import quiet
from tuner.profile.small_copy import build_copy
from tuner.profile.working_sets import Peaks, traced_backward_peaks, traced_pre_layer
from tuner.workload import ActivationProfile, Linear, TrainableSpec, WorkloadError


def _parts(
    by_layer: dict[int, int], keep: list[int], kinds: tuple[str, ...] | list[str]
) -> tuple[int, int, dict[str, int]]:
    """(outside, first-layer extras, bytes per kind) from bytes per kept layer."""
    per_kind: dict[str, int] = {}
    first: dict[str, int] = {}
    for position, index in enumerate(keep):
        kind = kinds[index]
        saved = by_layer.get(position, 0)
        if kind in first:
            per_kind[kind] = saved
        else:
            first[kind] = saved
    extra = 0
    for kind, saved in first.items():
        if kind in per_kind:
            extra += saved - per_kind[kind]
        else:
            per_kind[kind] = saved
    if len(keep) == len(kinds):  # every layer traced: their own sum, whatever differs between them (a freeze pattern)
        traced = sum(by_layer.get(position, 0) for position in range(len(keep)))
        extra = traced - sum(saved * list(kinds).count(kind) for kind, saved in per_kind.items())
    return by_layer.get(OUTSIDE, 0), extra, per_kind


Parts = tuple[int, int, dict[str, int]]  # (outside, first-layer extras, bytes per kind)
PROBE_LENGTHS = (4, 8)  # a model saving more tensors at the second is recurrent: traced step by step
SHORT_LENGTHS = (8, 16, 24)  # recurrent models are traced at these and extrapolated where exactly linear


def _traced_parts(
    model: nn.Module,
    keep: list[int],
    kinds: tuple[str, ...] | list[str],
    seq_len: int,
    fake_mode: FakeTensorMode | None,
    recurrent: list[bool],
) -> list[Parts]:
    """The parts at micro-batch 1, 2 and 3 for ``seq_len``.

    A recurrent model (Mamba, RWKV...: its layers run one step at a time, saving tensors at every step, so a trace
    costs time in proportion to the length) is traced at :data:`SHORT_LENGTHS` and extrapolated linearly, when
    every part is exactly linear through the three; else (quadratic attention beside the recurrence) it is traced
    at ``seq_len``. ``recurrent``: empty, or what the model without checkpointing showed (a checkpointed model
    saves only the layers' inputs, the same at every length), and filled on the first call.
    """

    def at(length: int) -> list[Parts]:
        return [_parts(saved_bytes_by_layer(model, batch, length, fake_mode), keep, kinds) for batch in (1, 2, 3)]

    if seq_len > SHORT_LENGTHS[-1]:
        if not recurrent:
            counts: list[int] = []
            for length in PROBE_LENGTHS:
                saved_bytes_by_layer(model, 1, length, fake_mode, counts)
            recurrent.append(counts[0] != counts[1])
        if recurrent[0]:
            short = [at(length) for length in SHORT_LENGTHS]
            extrapolated = _extrapolated(short, seq_len)
            if extrapolated is not None:
                return extrapolated
    return at(seq_len)


def _extrapolated(short: list[list[Parts]], seq_len: int) -> list[Parts] | None:
    """The parts at ``seq_len`` from those at :data:`SHORT_LENGTHS`, or None unless each is exactly linear."""
    first, second = SHORT_LENGTHS[:2]  # equally spaced
    step = second - first

    def line(a: int, b: int, c: int) -> int | None:
        if b - a != c - b or (b - a) * (seq_len - first) % step:
            return None
        return a + (b - a) * (seq_len - first) // step

    out: list[Parts] = []
    for one, two, three in zip(*short, strict=True):
        outside, extra = line(one[0], two[0], three[0]), line(one[1], two[1], three[1])
        kinds = {kind: line(one[2][kind], two[2][kind], three[2][kind]) for kind in one[2]}
        if outside is None or extra is None or any(value is None for value in kinds.values()):
            return None
        out.append((outside, extra, {kind: value for kind, value in kinds.items() if value is not None}))
    return out


def _reason(error: BaseException) -> str:
    """One line: the error's type and message (trimmed), and where in transformers or torch it was raised."""
    import traceback

    message = " ".join(str(error).split())[:240]
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "/tuner/" not in frame.filename]
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {message}{where}" if message else f"{type(error).__name__}{where}"


def trace_activations(
    config: dict[str, Any],
    kinds: tuple[str, ...] | list[str],
    seq_len: int,
    precision: str,
    attention: str,
    checkpointing: Iterable[bool],
    trainable: TrainableSpec | None = None,
    adapters: str = "",
) -> dict[bool, ActivationProfile]:
    """The activation profile of the model for these settings and each ``checkpointing`` setting asked for, traced
    at micro-batch 1, 2 and 3 under fake tensors (:func:`trace_lengths` at one length)."""
    return trace_lengths(config, kinds, (seq_len,), precision, attention, checkpointing, trainable, adapters)[seq_len]


def _keeps_every_layer(kinds: tuple[str, ...] | list[str], trainable: TrainableSpec | None) -> bool:
    """Whether the copy keeps every layer: a looped block runs layers by their index in the config, and a freeze
    pattern may freeze some layers of a kind and not others (only the last ones trained)."""
    return (trainable is not None and trainable.freeze is not None) or any(kind_runs(kind) > 1 for kind in kinds)


def trace_lengths(
    config: dict[str, Any],
    kinds: tuple[str, ...] | list[str],
    seq_lens: Iterable[int],
    precision: str,
    attention: str,
    checkpointing: Iterable[bool],
    trainable: TrainableSpec | None = None,
    adapters: str = "",
) -> dict[int, dict[bool, ActivationProfile]]:
    """The activation profiles at each of ``seq_lens``, by checkpointing setting asked for, traced at micro-batch
    1, 2 and 3 under fake tensors; the model's copy is built once per checkpointing setting for all the lengths.

    With checkpointing the non-checkpointed layers are traced too (``recompute`` is the largest of them): that one
    trace also gives the profile without checkpointing, so asking for both costs two traces, not three.
    ``trainable``, ``adapters``: the model as trained (:func:`build_copy`): frozen weights save no input for their
    weight gradient; the LoRA A input and the dropout masks are saved. ``zero3``: as ZeRO-3 trains it, every
    Linear saving its input whether its weight trains or not (:func:`zero3_linear`).
    """
    wanted, lengths = sorted(set(checkpointing)), sorted(set(seq_lens))
    traces: dict[bool, dict[int, list[Parts]]] = {}
    peaks: dict[int, list[Peaks] | None] = {}
    pre: dict[int, list[tuple[int, int]] | None] = {}
    experts: dict[bool, str] = {}
    recurrent: list[bool] = []
    for ckpt in (False, True) if True in wanted else (False,):
        whole, real = _keeps_every_layer(kinds, trainable), False
        while True:
            with quiet():
                model, keep, fake_mode = build_copy(
                    config, kinds, precision, attention, ckpt, trainable, adapters, whole, real
                )
            try:
                with quiet(), _as_trained(adapters, precision):
                    traces[ckpt] = {n: _traced_parts(model, keep, kinds, n, fake_mode, recurrent) for n in lengths}
                    if not ckpt:  # the moments the saved bytes miss (:mod:`.working_sets`), once
                        pre, peaks = _working_sets(model, keep, kinds, lengths, fake_mode, recurrent)
                break
            except WorkloadError:
                raise
            except Exception as error:
                following = _next_attempt(error, config, model, keep, kinds, max(lengths), (whole, real), trainable)
                if following is None:
                    where = "on real CPU tensors" if real else "under fake tensors"
                    raise WorkloadError(
                        "model.model_type", f"{config['model_type']} cannot be traced {where}: {_reason(error)}"
                    ) from None
                whole, real = following
        experts[ckpt] = str(getattr(model.config, "_experts_implementation", None) or "none")
    profiles: dict[int, dict[bool, ActivationProfile]] = {}
    for n in lengths:
        at = {c: by_length[n] for c, by_length in traces.items()}
        profiles[n] = {
            c: _with_pre_layer(
                _activation_profile(at, c, n, precision, attention, experts[c], adapters, peaks.get(n)), pre.get(n)
            )
            for c in wanted
        }
    return profiles


@contextlib.contextmanager
def _as_trained(adapters: str, precision: str) -> Iterator[None]:
    """The forward passes inside run as training runs them: every Linear saving its input as ZeRO-3's does
    (``adapters="zero3"``, :func:`zero3_linear`), under a ds_config's ``torch_autocast`` (trace precision
    ``precision``, :func:`traced_autocast`)."""
    with zero3_linear() if adapters == "zero3" else contextlib.nullcontext(), traced_autocast(precision):
        yield


REAL_TRACE_BYTES = 4 * 2**30  # the most a trace on real CPU tensors may hold (the copy's weights and activations)


def _next_attempt(
    error: Exception,
    config: dict[str, Any],
    model: nn.Module,
    keep: list[int],
    kinds: tuple[str, ...] | list[str],
    seq_len: int,
    attempt: tuple[bool, bool],
    trainable: TrainableSpec | None,
) -> tuple[bool, bool] | None:
    """After a trace failed: (whole, real) to try next, or None. A forward pass whose ops read tensors' values
    (``.item()``, ``nonzero``: JetMoE's and XLM's, LongCat-Flash's routing), which fake tensors cannot run, is
    traced on real CPU tensors with random weights (byte-equal to fake ones) where the copy is small enough
    (:data:`REAL_TRACE_BYTES`); a forward pass that needs every layer is traced on the whole model."""
    whole, real = attempt
    reads_values = isinstance(error, (DataDependentOutputException, DynamicOutputShapeException))
    if reads_values and not real and (trainable is None or trainable.is_full) and _layers_attributable(kinds, config):
        text = text_config(model.config)
        weights = sum(param.numel() * param.element_size() for param in model.parameters())
        width = int(getattr(text, "hidden_size", 0) or 0) * 64 * len(keep) + int(text.vocab_size) * 16
        if weights + 3 * seq_len * width <= REAL_TRACE_BYTES:
            return whole, True
    if not whole and len(keep) < len(kinds):  # a forward that needs every layer: traced whole
        return True, real
    return None


def _layers_attributable(kinds: tuple[str, ...] | list[str], config: dict[str, Any]) -> bool:
    """Whether the layer list found holds the config's decoder layers, one module each (or one index of parallel
    lists, XLM's, which :func:`saved_bytes_by_layer` attributes whole), as a real trace needs: not a list of
    sublayers counted one by one, whose real trace would count the rest as outside the layers."""
    text = text_config(hf_config(config))
    return bool(config_value(text, depth_field(text, len(kinds))) == len(kinds))


def _activation_profile(
    traces: dict[bool, list[Parts]],
    checkpointing: bool,
    seq_len: int,
    precision: str,
    attention: str,
    experts: str,
    adapters: str,
    peaks: list[Peaks] | None = None,
) -> ActivationProfile:
    """The profile of one checkpointing setting from the traces at micro-batch 1, 2 and 3 (with checkpointing, the
    largest non-checkpointed layer is what a layer's recomputation holds, and ``peaks`` its worst moments in
    backward)."""
    one, two, three = traces[checkpointing]
    layers = {kind: Linear.through(one[2][kind], two[2][kind], three[2][kind]) for kind in one[2]}
    lines = [Linear.through(*(point[i] for point in peaks)) for i in range(5)] if peaks else [Linear()] * 5
    recompute = Linear()
    peak, peak_outside_mlp = (lines[0], lines[2]) if checkpointing else (Linear(), Linear())
    if checkpointing:
        plain = traces[False]
        recompute = max(  # one run of a looped layer is recomputed at a time
            (Linear.through(*(trace[2][kind] // kind_runs(kind) for trace in plain)) for kind in plain[0][2]),
            key=lambda line: line.at(2),
        )
    return ActivationProfile(
        seq_len=seq_len,
        precision=precision,
        attention=attention,
        experts=experts,
        checkpointing=checkpointing,
        outside=Linear.through(one[0], two[0], three[0]),
        first_extra=Linear.through(one[1], two[1], three[1]),
        layers=layers,
        recompute=recompute,
        adapters=adapters,
        backward_peak=peak,
        backward_peak_outside_mlp=peak_outside_mlp,
        backward_excess=lines[1],
        backward_excess_outside_mlp=lines[3],
        mlp_saved=lines[4],
    )


def _working_sets(
    model: nn.Module,
    keep: list[int],
    kinds: tuple[str, ...] | list[str],
    lengths: list[int],
    fake_mode: FakeTensorMode | None,
    recurrent: list[bool],
) -> tuple[dict[int, list[tuple[int, int]] | None], dict[int, list[Peaks] | None]]:
    """Before the first layer (:func:`traced_pre_layer`) and the layers' backward (:func:`_backward_peaks`, not for
    a recurrent model) at each length."""
    pre = {n: traced_pre_layer(model, n, fake_mode) for n in lengths}
    if recurrent and recurrent[0]:
        return pre, {}
    return pre, {n: _backward_peaks(model, keep, kinds, n, fake_mode) for n in lengths}


def _with_pre_layer(entry: ActivationProfile, pre: list[tuple[int, int]] | None) -> ActivationProfile:
    """``entry`` with the pre-layer fields of :func:`traced_pre_layer`'s points."""
    if not pre:
        return entry
    peak = Linear.through(*(point[0] for point in pre))
    return replace(entry, pre_layer_peak=peak, pre_layer_held=Linear.through(*(point[1] for point in pre)))


def _backward_peaks(
    model: nn.Module,
    keep: list[int],
    kinds: tuple[str, ...] | list[str],
    seq_len: int,
    fake_mode: FakeTensorMode | None,
) -> list[Peaks] | None:
    """The worst backward moments, at micro-batch 1, 2 and 3, of the first kept layer of each kind (the largest)."""
    firsts: dict[str, int] = {}
    for position, index in enumerate(keep):
        firsts.setdefault(kinds[index], position)
    return traced_backward_peaks(model, sorted(firsts.values()), seq_len, fake_mode)
