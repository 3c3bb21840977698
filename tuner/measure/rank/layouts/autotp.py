"""AutoTP tensor parallelism on a rank: the model handed to ``deepspeed.initialize`` so that DeepSpeed shards it by
the transformers model's own ``tp_plan``, and the rank's place in the layout.

DeepSpeed 0.19.8 applies AutoTP inside ``deepspeed.initialize`` when ``tensor_parallel.autotp_size`` > 1
(``DeepSpeedEngine._apply_autotp_partitioning``). It reads the plan from the module it is given: ``config.
base_model_tp_plan``, the class's ``_tp_plan`` and the instance's ``_tp_plan`` (``tensor_parallel.config.
_get_hf_tp_plan``), and matches each pattern anywhere in a parameter's name (``.*`` + pattern). The runner trains a
:class:`~tuner.measure.rank.models.TransformersCausalLM` wrapper, which has neither: DeepSpeed would fall back to its
name-heuristic AutoTP, another sharding than the one the estimator follows (:mod:`tuner.estimator.layouts.autotp`,
checked against the HF model handed over directly by ``bench/tp_true_peak.py``). :func:`expose_tp_plan` gives the
wrapper the inner model's config and merged plan, so the same partition styles apply to the same Linears (q, k, v,
gate, up column-wise; o, down row-wise; an untied ``lm_head`` column-wise with its output gathered).

DeepSpeed groups consecutive ranks into a tensor-parallel group (its device mesh is ``(dp, tp)``): a rank's tp rank
is ``rank % tp``, its data-parallel rank ``rank // (sp × tp)``, and every rank of a group must see the same batch
(DeepSpeed checks that on the first forward).
"""

from __future__ import annotations

from typing import Any

from tuner.workload import Ranks, TrialConfig, Workload
from tuner.workload.layouts import AUTOTP

AUTOTP_BUILT_IN = "needs the transformers model (model_impl transformers): DeepSpeed shards by its tp_plan"
AUTOTP_PEFT = "AutoTP under a peft adapter is not measured (the adapter renames the Linears the tp_plan names)"


def refusal(workload: Workload, trial: TrialConfig, device: str) -> tuple[str, str] | None:
    """``(field, reason)`` when a run cannot apply ``trial``'s AutoTP as the estimate says: on the built-in model
    (no ``tp_plan``) or under a peft adapter (it renames the Linears the plan names), else None."""
    if trial.layout.degree(AUTOTP) <= 1:
        return None
    if workload.model.implementation != "transformers":
        return AUTOTP.key, AUTOTP_BUILT_IN
    if workload.trainable.peft:
        return AUTOTP.key, AUTOTP_PEFT
    return None


def expose_tp_plan(model: Any, inner: Any) -> dict[str, str]:
    """Give ``model`` (the module DeepSpeed is handed, wrapping the transformers model ``inner``) ``inner``'s
    ``config`` and merged ``tp_plan`` where DeepSpeed looks for them; returns the plan.

    Raises:
        ValueError: ``inner`` has no ``tp_plan`` (DeepSpeed would shard by name heuristics instead).
    """
    from deepspeed.runtime.tensor_parallel.config import _get_hf_tp_plan

    plan = _get_hf_tp_plan(inner)
    if not plan:
        name = type(inner).__name__
        raise ValueError(f"tensor_parallel.autotp_size: {name} has no transformers tp_plan for AutoTP to shard by")
    model.config = inner.config
    model._tp_plan = dict(plan)
    return dict(plan)


def local_elements(module: Any) -> int:
    """Parameter elements this rank holds after AutoTP's sharding, before ZeRO-3 partitions them (``ds_numel``)."""
    return sum(getattr(param, "ds_numel", param.numel()) for param in module.parameters())


def place(ranks: Ranks, rank: int) -> dict[str, int]:
    """The rank's tensor-parallel size and rank and its data-parallel rank, as DeepSpeed groups them.

    >>> place(Ranks(4, tensor=2), 3)
    {'tensor_parallel': 2, 'tp_rank': 1, 'dp_rank': 1}
    """
    where = ranks.place(rank)
    return {"tensor_parallel": ranks.tensor, "tp_rank": where.tensor_parallel, "dp_rank": where.data_parallel}


__all__ = ["AUTOTP_BUILT_IN", "AUTOTP_PEFT", "expose_tp_plan", "local_elements", "place", "refusal"]
