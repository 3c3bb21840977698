"""What a measured run refuses of a trial's AutoTP and ZeRO++ settings, before any rank starts (pure Python: the
installed DeepSpeed's version is read from its package metadata, DeepSpeed itself is not imported).

- The layout (:func:`tuner.workload.check_layout`): tp against the GPUs of a node and the heads, hpZ against the
  stage and the ranks, and AutoTP with ZeRO-3 against the DeepSpeed that will train (0.19.4 or newer).
- AutoTP on the built-in model or under a peft adapter: the runner hands DeepSpeed the transformers model's
  ``tp_plan`` (:mod:`tuner.measure.rank.layouts.autotp`); the built-in model has none, and an adapter renames the
  Linears the plan names (``q_proj.base_layer``), so DeepSpeed would shard by its name heuristics, not as the estimate
  says.
- AutoEP on the built-in model or under a peft adapter: DeepSpeed finds the MoE blocks of a transformers model by
  its preset (:mod:`tuner.measure.rank.layouts.autoep`); the estimator does not model AutoEP with an adapter. CUDA-only
  AutoEP paths on CPU ranks: ``comm_backend: "deepep"`` (DeepEP over NVSHMEM) and ``async_split_plan`` ("requires CUDA
  tensors", ``auto_ep_layer.py``).
- qwZ and qgZ (``zero_quantized_weights``, ``zero_quantized_gradients``) at ZeRO-3 on CPU ranks: DeepSpeed's
  quantizer kernels are built by ``QuantizerBuilder``, which has no CPU implementation; the estimate stands alone.
"""

from __future__ import annotations

from importlib import metadata

from tuner.measure.rank.layouts.autoep import AUTOEP_BUILT_IN, AUTOEP_CUDA, AUTOEP_PEFT
from tuner.measure.rank.layouts.autoep import refusal as autoep_refusal
from tuner.measure.rank.layouts.autotp import AUTOTP_BUILT_IN, AUTOTP_PEFT
from tuner.measure.rank.layouts.autotp import refusal as autotp_refusal
from tuner.workload import ConfigError, TrialConfig, Workload, check_layout
from tuner.workload.layouts import AUTOTP

QUANTIZER_ON_CPU = (
    "DeepSpeed's QuantizerBuilder needs CUDA (its quantizer kernels are not implemented on CPU): estimate only on CPU "
    "ranks (dstune estimate), not measured"
)


def installed_deepspeed() -> str | None:
    """The installed DeepSpeed's version, or None when it is not installed here."""
    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return None


def layout_refusal(
    workload: Workload, trial: TrialConfig, device: str, deepspeed_version: str | None = None
) -> tuple[str, str] | None:
    """``(field, reason)`` when a run of ``trial``'s AutoTP or ZeRO++ settings cannot be measured on ``device``
    with DeepSpeed ``deepspeed_version`` (default: the installed one), else None.

    >>> from dataclasses import replace
    >>> from tuner.workload import ClusterSpec, load_builtin_model
    >>> hf = replace(load_builtin_model("tiny-llama"), implementation="transformers")
    >>> tiny = Workload(hf, ClusterSpec(gpus_per_node=2, device="cpu"))
    >>> layout_refusal(tiny, TrialConfig({"zero_optimization": {"stage": 3, "zero_quantized_weights": True}}), "cpu")
    ... # doctest: +ELLIPSIS
    ('zero_optimization.zero_quantized_weights', "DeepSpeed's QuantizerBuilder needs CUDA ...")
    >>> autotp3 = TrialConfig({"tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 3}})
    >>> layout_refusal(tiny, autotp3, "cpu", "0.19.3")
    ('tensor_parallel.autotp_size', 'AutoTP with ZeRO-3 needs DeepSpeed >= 0.19.4, this is 0.19.3')
    >>> layout_refusal(tiny, autotp3, "cpu", "0.19.8") is None
    True
    >>> layout_refusal(Workload(load_builtin_model("tiny-llama"), tiny.cluster), autotp3, "cpu")[1]
    'needs the transformers model (model_impl transformers): DeepSpeed shards by its tp_plan'
    """
    try:
        check_layout(workload, trial, deepspeed_version or installed_deepspeed())
    except ConfigError as error:
        return error.field, error.message
    for refusal in (autotp_refusal, autoep_refusal):  # each layout's own (tuner.measure.rank.layouts)
        refused = refusal(workload, trial, device)
        if refused is not None:
            return refused
    zero = trial.zero
    if device != "cuda" and zero.stage == 3:  # ZeRO-3's (DeepSpeed ignores both at stages 0-2)
        for key, on in (
            ("zero_quantized_weights", zero.quantized_weights),
            ("zero_quantized_gradients", zero.quantized_gradients),
        ):
            if on:
                return f"zero_optimization.{key}", QUANTIZER_ON_CPU
    return None


def with_tp_split(workload: Workload, trial: TrialConfig) -> Workload:
    """``workload`` with its model's parameter facts (AutoTP's split from the ``tp_plan`` among them) where an AutoTP
    layout needs them checked and none came with it (a run's spec carries no profile): an MoE trains under AutoTP
    only with a plan DeepSpeed takes (:func:`tuner.workload.tensor_parallel_problem`)."""
    if trial.layout.degree(AUTOTP) <= 1 or workload.profile is not None or not workload.model.hf_config:
        return workload
    import json
    from dataclasses import replace

    from tuner.profile.hf import describe

    return replace(workload, profile=describe(json.loads(workload.model.hf_config)))


__all__ = [
    "AUTOEP_BUILT_IN",
    "AUTOEP_CUDA",
    "AUTOEP_PEFT",
    "AUTOTP_BUILT_IN",
    "AUTOTP_PEFT",
    "QUANTIZER_ON_CPU",
    "installed_deepspeed",
    "layout_refusal",
    "with_tp_split",
]
