"""The workload facts a search space's ``when`` conditions may test (:data:`~tuner.space.conditions.WORKLOAD_FACTS`):
how much of the model trains, what its optimizer states weigh, and the sequence length, ranks and attention heads
that decide where Ulysses sequence parallelism and ALST's tiling mean something; the GPUs of a node, the nodes and
whether the model has routed experts, which decide where AutoTP and ZeRO++ hpZ do."""

from __future__ import annotations

from tuner.estimator import all_params, trainable_params
from tuner.space.conditions import WORKLOAD_FACTS
from tuner.workload import Workload
from tuner.workload.layout_checks import is_moe

OPTIMIZER_STATE_BYTES = 12  # per trainable parameter: fp32 master, momentum and variance (mixed-precision Adam)


def workload_facts(workload: Workload) -> dict[str, int]:
    """The workload facts ``when`` conditions may test (:data:`~tuner.space.conditions.WORKLOAD_FACTS`).

    Example:
        >>> from tuner.workload import Workload, model_from_param_count
        >>> workload_facts(Workload(model_from_param_count(1e6)))
        {'trainable_params': 1000000, 'frozen_params': 0, 'optimizer_state_bytes': 12000000, 'seq_len': 2048, \
'world_size': 1, 'attention_heads': 0, 'transformers_model': 0, 'gpus_per_node': 1, 'nodes': 1, \
'moe_model': 0, 'cpu_ranks': 0}
    """
    trained = trainable_params(workload)
    facts = {
        "trainable_params": trained,
        "frozen_params": all_params(workload) - trained,
        "optimizer_state_bytes": OPTIMIZER_STATE_BYTES * trained,
        "seq_len": workload.train.seq_len,
        "world_size": workload.cluster.world_size,
        "attention_heads": workload.model.num_heads,
        "transformers_model": int(workload.model.implementation == "transformers"),
        "gpus_per_node": workload.cluster.gpus_per_node,
        "nodes": workload.cluster.nodes,
        "moe_model": int(is_moe(workload.model)),
        "cpu_ranks": int(workload.cluster.device == "cpu"),
    }
    assert set(facts) == set(WORKLOAD_FACTS), "every documented fact has a value"
    return facts


__all__ = ["OPTIMIZER_STATE_BYTES", "workload_facts"]
