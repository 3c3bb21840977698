"""The estimator reads each parallel layout through its registry (:data:`tuner.estimator.layouts.LAYOUTS`): one
:class:`~tuner.estimator.layouts.base.LayoutTerms` per layout of the workload's registry, called for the layouts a
trial turns on, and a layout's terms reach the estimate through its registry line alone."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from tuner.estimator import estimate, resolve
from tuner.estimator import layouts as estimator_layouts
from tuner.estimator.layouts import LAYOUTS, LayoutTerms, active
from tuner.estimator.settings import Settings
from tuner.estimator.terms import Contribution, detail, transient
from tuner.estimator.throughput.hardware import Hardware, hardware_for
from tuner.estimator.throughput.prediction import step_terms
from tuner.workload import ClusterSpec, Ranks, Workload, load_builtin_model
from tuner.workload.layouts import LAYOUTS as WORKLOAD_LAYOUTS


def test_the_registry_mirrors_the_workloads() -> None:
    assert [layout.kind for layout in LAYOUTS] == list(WORKLOAD_LAYOUTS)
    assert all(isinstance(layout, LayoutTerms) for layout in LAYOUTS)


@pytest.mark.parametrize(
    ("ranks", "on"),
    [
        (Ranks(8), []),
        (Ranks(8, sequence=2), ["sequence_parallel"]),
        (Ranks(8, tensor=2, hpz=2), ["tensor_parallel", "hpz_partition_size"]),
        (Ranks(8, expert=4), ["expert_parallel"]),
    ],
)
def test_a_layout_is_on_where_its_group_has_more_than_one_rank(ranks: Ranks, on: list[str]) -> None:
    assert [layout.kind.field for layout in active(ranks)] == on


class _Probe(LayoutTerms):
    """A layout on every trial that records what each hook saw: a registry line is all it takes."""

    kind = WORKLOAD_LAYOUTS[0]

    def group(self, ranks: Ranks) -> int:
        return 2

    def rank_view(self, workload: Workload, s: Settings) -> tuple[Workload, Contribution]:
        return workload, detail("probe_view", workload.model.n_params)

    def state_terms(self, numels: tuple[int, ...], s: Settings, details: Mapping[str, int]) -> Contribution:
        return detail("probe_states_seen", details["partition_elements"])

    def buffer_terms(self, workload: Workload, s: Settings) -> Contribution:
        return transient("probe_buffer", "backward", 1000)

    def collective_seconds(self, workload: Workload, s: Settings, hw: Hardware) -> tuple[float, int]:
        return 0.5, 4


def test_a_layouts_terms_reach_the_estimate_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    work = Workload(load_builtin_model("tiny-llama"), ClusterSpec(gpus_per_node=4))
    config = {"zero_optimization": {"stage": 3}}
    plain, hw = estimate(work, config), hardware_for(work)
    plain_time = step_terms(work, resolve(work, config), hw)
    active.cache_clear()
    monkeypatch.setattr(estimator_layouts, "LAYOUTS", (*LAYOUTS, _Probe()))
    try:
        est, time = estimate(work, config), step_terms(work, resolve(work, config), hw)
    finally:
        active.cache_clear()
    assert time.bandwidth == pytest.approx(plain_time.bandwidth + 0.5)
    assert time.latency == pytest.approx(plain_time.latency + 4 * hw.collective_s)
    assert est.details["probe_view"] == work.model.n_params
    assert est.details["probe_states_seen"] == est.details["partition_elements"]
    assert est.details["probe_buffer"] == 1000
    assert plain.phases["backward"].gpu["buffers"] + 1000 == est.phases["backward"].gpu["buffers"]
    assert "probe_view" not in plain.details
