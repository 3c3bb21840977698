"""What ``dstune best`` says with a trial that uses AutoTP, ZeRO++ hpZ or AutoEP (pure Python).

The exported ds_config keeps ``tensor_parallel.autotp_size`` and ``zero_optimization.zero_hpz_partition_size`` as
measured; under AutoTP it carries no ``train_batch_size`` (:meth:`tuner.workload.TrialConfig.deepspeed_config`:
DeepSpeed 0.19.8 checks it against every rank, tp ranks included). The notes say what the training code must do:

- ``--format deepspeed``: hand ``deepspeed.initialize`` the transformers model itself (DeepSpeed shards it by the
  model's ``tp_plan``, as dstune's runner does), and feed the ranks of a tensor-parallel group (consecutive ranks)
  the same batch.
- ``--format hf``: the HF Trainer runs DeepSpeed through accelerate, whose DeepSpeed path (accelerate 1.16,
  ``Accelerator._prepare_deepspeed``) takes the degree from this config's ``tensor_parallel.autotp_size``, builds a
  ``tp`` device mesh of that size, and its data loader gives a tp group's ranks the same batch.
  ``ParallelismConfig(tp_size=...)`` is something else: accelerate's torch-native tensor parallelism
  (``Accelerator._prepare_tp``, DTensor over a model loaded with a ``tp_plan``), another sharding than the AutoTP
  dstune measured, so the note says to leave it at 1. Measured (transformers' Trainer, accelerate 1.16,
  DeepSpeed 0.19.8, gloo CPU ranks): the export trains as is on 2 ranks (TP 2) and 4 (TP 2 × DP 2), each rank
  holding 0.62 × the parameters, DeepSpeed's check of a tp group's batches passing; DeepSpeed derives
  ``train_batch_size`` over every rank (2 on TP 2, where one sample trains a step).

AutoEP (``expert_parallel: {enabled, autoep_size}``) stays in both formats as measured; it does not change the batch
(every rank trains its own samples). DeepSpeed 0.19.8 applies it inside ``deepspeed.initialize`` to the module it is
given, finding the MoE blocks by the preset's pattern (``model.layers.N.mlp``) and ``config.model_type``: hand it the
transformers model itself. accelerate's DeepSpeed path (``Accelerator._prepare_deepspeed``) does exactly that and
passes the config through, so the HF Trainer gets AutoEP from this config alone; accelerate has no expert-parallel
setting of its own (``ParallelismConfig`` has no ep dimension; transformers' ``enable_expert_parallel`` is
transformers' own expert parallelism, not DeepSpeed's). Read from accelerate's source, not measured through the
Trainer. With transformers 5.24 the Mixtral and Qwen MoE presets fail in ``deepspeed.initialize`` unless the
output-capture registry shim runs first (:func:`tuner.measure.rank.layouts.autoep.registry_shim`).
"""

from __future__ import annotations

from tuner.workload import TrialConfig
from tuner.workload.layouts import AUTOEP, AUTOTP, HPZ


def tensor_parallel_notes(trial: TrialConfig, format: str) -> list[str]:
    """The notes for ``trial``'s AutoTP and hpZ settings in an export of ``format`` (``deepspeed`` or ``hf``).

    Example:
        >>> notes = tensor_parallel_notes(TrialConfig({"tensor_parallel": {"autotp_size": 4}}), "hf")
        >>> "ParallelismConfig" in notes[0], len(notes)
        (True, 1)
        >>> tensor_parallel_notes(TrialConfig({}), "deepspeed")
        []
    """
    tp = trial.layout.degree(AUTOTP)
    notes = []
    if tp > 1:
        batch = (
            f"samples per optimizer step = micro-batch × accumulation × world / {tp} (DeepSpeed 0.19.8 counts every "
            "rank in train_batch_size, so the config leaves it to DeepSpeed)"
        )
        if format == "hf":
            notes.append(
                f"AutoTP {tp}: keep tensor_parallel.autotp_size in this config (accelerate's DeepSpeed path reads it "
                "there and gives each tensor-parallel group one batch) and leave accelerate's ParallelismConfig "
                "tp_size at 1: that is accelerate's torch-native tensor parallelism, not DeepSpeed's AutoTP; " + batch
            )
        else:
            notes.append(
                f"AutoTP {tp}: pass the transformers model itself to deepspeed.initialize (DeepSpeed shards it by "
                f"the model's tp_plan) and give the {tp} consecutive ranks of each tensor-parallel group the same "
                f"batch (data-parallel rank = rank // {tp}); " + batch
            )
    hpz = trial.layout.degree(HPZ)
    if hpz > 1:
        notes.append(
            f"ZeRO++ hpZ {hpz}: each node keeps a secondary 16-bit parameter partition over groups of {hpz} "
            "consecutive ranks; place the ranks node by node (as the deepspeed and torchrun launchers do)"
        )
    return notes + expert_parallel_notes(trial, format)


def expert_parallel_notes(trial: TrialConfig, format: str) -> list[str]:
    """The note for ``trial``'s AutoEP degree in an export of ``format`` (module docstring).

    Example:
        >>> notes = expert_parallel_notes(TrialConfig({"expert_parallel": {"enabled": True, "autoep_size": 2}}), "hf")
        >>> "accelerate" in notes[0], "registry_shim" in notes[0]
        (True, True)
        >>> expert_parallel_notes(TrialConfig({}), "hf")
        []
    """
    ep = trial.layout.degree(AUTOEP)
    if ep <= 1:
        return []
    shim = (
        "with transformers 5.24 the Mixtral and Qwen MoE presets fail in deepspeed.initialize (TypeError at "
        "auto_ep_presets/base.py:326) unless tuner.measure.rank.layouts.autoep.registry_shim() runs first in every rank"
    )
    where = (
        "the HF Trainer takes it as is: accelerate's DeepSpeed path hands deepspeed.initialize the transformers model "
        "and this config, and has no expert-parallel setting of its own (ParallelismConfig has no ep size; "
        "transformers' enable_expert_parallel is another mechanism, leave it off); not measured through the Trainer"
        if format == "hf"
        else "pass the transformers model itself to deepspeed.initialize (AutoEP finds the MoE blocks as "
        "model.layers.N.mlp by its config's model_type)"
    )
    return [f"AutoEP {ep}: each rank holds experts / {ep} of every MoE layer and trains its own batch; {where}; {shim}"]


__all__ = ["expert_parallel_notes", "tensor_parallel_notes"]
