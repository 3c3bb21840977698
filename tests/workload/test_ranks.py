"""One description of the ranks: every group's members partition the world the way DeepSpeed 0.19.8 groups it
(consecutive sequence-, tensor- and expert-parallel groups, strided data-parallel ones), a rank's place is its index in
its groups, and the counts every room reads (data-parallel, ZeRO's partition, DeepSpeed's batch-check world) agree
with the groups."""

from itertools import product

import pytest

from tuner.workload import ConfigError, ParallelLayout, Ranks, TrialConfig

LAYOUTS = [
    {},
    {"sequence": 2},
    {"sequence": 4},
    {"tensor": 2},
    {"tensor": 4},
    {"expert": 2},
    {"expert": 8},
    {"hpz": 4},
    {"quantized_gradients": True},
]


@pytest.mark.parametrize(("degrees", "nodes"), list(product(LAYOUTS, (1, 2))))
def test_every_group_partitions_the_world_and_places_index_it(degrees: dict, nodes: int) -> None:
    ranks = Ranks(world=8 * nodes, gpus_per_node=8, **degrees)
    for group in ranks.communicators():
        blocks = {ranks.members(group.name, rank) for rank in range(ranks.world)}
        assert sorted(r for block in blocks for r in block) == list(range(ranks.world)), group.name
        assert all(len(block) == group.size for block in blocks), group.name
        mine = ranks.members(group.name, 0)  # the rank's own node holds `local` of its group
        assert sum(1 for r in mine if r < ranks.per_node) == group.local, group.name
    for rank in range(ranks.world):
        place = ranks.place(rank)
        for name, index in (
            ("sequence_parallel", place.sequence_parallel),
            ("tensor_parallel", place.tensor_parallel),
            ("expert_parallel", place.expert_parallel),
        ):
            if any(g.name == name for g in ranks.communicators()):
                assert ranks.members(name, rank)[index] == rank
        assert place.data_parallel < ranks.data_parallel


def test_the_counts_every_room_reads() -> None:
    ulysses, autotp, autoep = Ranks(16, 8, sequence=4), Ranks(16, 8, tensor=4), Ranks(16, 8, expert=4)
    # the batch's data-parallel ranks: a sequence- or tensor-parallel group trains one sample
    assert (ulysses.data_parallel, autotp.data_parallel, autoep.data_parallel) == (4, 4, 16)
    # ZeRO partitions over every rank under Ulysses (sp × dp), over the mesh's data-parallel group under AutoTP
    assert (ulysses.zero_partition, autotp.zero_partition, autoep.zero_partition) == (16, 4, 16)
    assert autoep.expert_data_parallel == len(autoep.members("expert_data_parallel", 0)) == 4
    assert len(autotp.members("data_parallel", 5)) == autotp.zero_partition
    # DeepSpeed's batch check without an mpu divides the world by sp only
    assert (ulysses.deepspeed_world, autotp.deepspeed_world) == (4, 16)


def test_a_trials_ranks_make_hpz_and_qgz_groups_at_zero3_only() -> None:
    zero = {"zero_hpz_partition_size": 4, "zero_quantized_gradients": True}
    names = {
        stage: {
            c.name for c in TrialConfig({"zero_optimization": {"stage": stage, **zero}}).ranks(16, 8).communicators()
        }
        for stage in (2, 3)
    }
    assert names[2] == {"world", "data_parallel"}
    assert names[3] == {"world", "data_parallel", "hpz", "quantized_all_to_all_local", "quantized_all_to_all_global"}


def test_a_layout_that_does_not_divide_the_ranks_names_its_key() -> None:
    with pytest.raises(ConfigError, match=r"tensor_parallel\.autotp_size: tp = 4 must divide the 6 ranks"):
        ParallelLayout(tensor_parallel=4).data_parallel(6)
    assert Ranks(6, tensor=4).data_parallel == 1  # unchecked, as the space counts a study's ranks
