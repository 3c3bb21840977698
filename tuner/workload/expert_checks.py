"""Where a trial's AutoEP expert parallelism (``expert_parallel.autoep_size`` = ep, when ``expert_parallel.enabled``)
meets the workload: what DeepSpeed 0.19.8 accepts, refused in one line naming the field before any work.

The rules, read from DeepSpeed 0.19.8's source:

- AutoEP replaces the MoE blocks of a supported transformers model (a preset picked by ``config.model_type``,
  ``module_inject/auto_ep_presets/registry.py:167`` ``resolve_preset_candidates``: ``mixtral``, ``qwen2_moe``,
  ``qwen3_moe``, ``qwen3_5_moe_text``, ``deepseek_v2``, ``deepseek_v3``, ``minimax_m3_vl_text``). A dense model, or
  a model type without a preset and without a custom ``moe_layer_pattern``, has nothing to replace: DeepSpeed would
  train it without experts sharded, silently, so it is refused.
- ep must divide every MoE layer's routed experts (``module_inject/auto_ep_config.py:369`` and ``:378``
  ``validate_autoep_post_detection``: each rank owns ``experts / ep`` of them).
- ep × ``expert_tensor_parallel_size`` must divide the ranks (``module_inject/auto_ep_folding.py:110``
  ``build_folding_spec``); the expert-data-parallel group is ``world / ep`` ranks, over which ZeRO partitions the
  experts (``utils/groups.py`` ``_create_expert_and_data_parallel``). ep need not divide the data-parallel ranks:
  without AutoTP those are the world.
- ``expert_tensor_parallel_size`` must be 1 (``auto_ep_folding.py:215``); ``load_balance_coeff`` must be null
  (``auto_ep_config.py:121``).
- At ZeRO-3, AutoEP refuses Ulysses sequence parallelism, hpZ and qgZ (``runtime/engine.py:2220``, ``:2226``,
  ``:2223``, ``_validate_zero3_moe_compatibility``). At ZeRO 0-2 it runs beside Ulysses (groups of consecutive
  ranks); AutoEP with AutoTP ("folding") exists in DeepSpeed, but dstune refuses AutoTP on MoE models
  (:mod:`.layout_checks`).

Example:
    >>> from tuner.workload import ClusterSpec, ModelSpec, TrialConfig, Workload, check_expert_parallel
    >>> mixtral = ModelSpec("mixtral", "mixtral", hf_config='{"model_type": "mixtral", "num_local_experts": 8}')
    >>> work = Workload(mixtral, ClusterSpec(gpus_per_node=8))
    >>> check_expert_parallel(work, TrialConfig({"expert_parallel": {"enabled": True, "autoep_size": 4}}))
    >>> check_expert_parallel(work, TrialConfig({"expert_parallel": {"enabled": True, "autoep_size": 3}}))
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tuner.workload.config_values.ConfigError: expert_parallel.autoep_size: ep = 3 must divide the 8 routed experts ...
"""

from __future__ import annotations

from tuner.workload.spec import Workload

EP_KEY = "expert_parallel.autoep_size"
# DeepSpeed 0.19.8's AutoEP presets by transformers model_type (module_inject/auto_ep_presets/*.py hf_model_types)
AUTOEP_MODEL_TYPES = frozenset(
    {"mixtral", "qwen2_moe", "qwen3_moe", "qwen3_5_moe_text", "deepseek_v2", "deepseek_v3", "minimax_m3_vl_text"}
)


def expert_parallel_problem(workload: Workload, ep: int, custom_pattern: bool = False) -> str | None:
    """Why AutoEP cannot run at degree ``ep`` on ``workload`` (an MoE model with a preset, the experts, the ranks),
    or None. ``custom_pattern``: the config names its own ``moe_layer_pattern`` (no preset needed).

    >>> from tuner.workload import ClusterSpec, ModelSpec, Workload, load_builtin_model
    >>> mixtral = ModelSpec("mixtral", "mixtral", hf_config='{"model_type": "mixtral", "num_local_experts": 8}')
    >>> work = Workload(mixtral, ClusterSpec(gpus_per_node=4, nodes=2))
    >>> [ep for ep in (1, 2, 3, 4, 8, 16) if expert_parallel_problem(work, ep) is None]
    [1, 2, 4, 8]
    >>> expert_parallel_problem(Workload(load_builtin_model("llama-2-7b"), work.cluster), 2)
    'AutoEP needs an MoE model: llama-2-7b has no routed experts'
    """
    if ep <= 1:
        return None
    model, world = workload.model, workload.cluster.world_size
    experts = model.routed_experts
    if not experts:
        return f"AutoEP needs an MoE model: {model.name} has no routed experts"
    model_type = model.text_config.get("model_type") or model.family
    if model_type not in AUTOEP_MODEL_TYPES and not custom_pattern:
        return (
            f"DeepSpeed's AutoEP has no preset for model_type {model_type!r} (presets: "
            f"{', '.join(sorted(AUTOEP_MODEL_TYPES))}; or set expert_parallel.moe_layer_pattern)"
        )
    if experts % ep:
        return f"ep = {ep} must divide the {experts} routed experts of each MoE layer (each rank owns experts / ep)"
    if world % ep:
        return f"ep = {ep} must divide the {world} ranks (the expert-data-parallel group is world / ep)"
    return None


__all__ = ["AUTOEP_MODEL_TYPES", "EP_KEY", "expert_parallel_problem"]
