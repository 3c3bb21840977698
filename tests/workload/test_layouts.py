"""The layouts' registry: each layout's degree field, ds_config key, config and checks agree with the layout class,
the default space and the request, so the rooms that derive from it (space checks, request config, CLI flags) read
one declaration."""

from dataclasses import fields

import pytest

from tuner.requests import TrialSettings
from tuner.space import default_space_path, load_space
from tuner.space.choices import LAYOUT_PROBLEMS
from tuner.workload import ClusterSpec, ParallelLayout, TrialConfig, Workload, load_builtin_model
from tuner.workload.layouts import LAYOUTS, LayoutKind


@pytest.mark.parametrize("kind", LAYOUTS, ids=lambda kind: kind.field)
def test_a_layouts_config_reads_back_as_its_degree(kind: LayoutKind) -> None:
    assert kind.field in {f.name for f in fields(ParallelLayout)}
    config = {"zero_optimization": {"stage": 3}, **kind.config(4)}
    if kind.field == "hpz_partition_size":
        config = kind.config(4) | {"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 4}}
    assert getattr(TrialConfig(config).layout, kind.field) == 4
    assert kind.config(1) == {} and kind.label in ParallelLayout(**{kind.field: 4}).label()


@pytest.mark.parametrize("kind", LAYOUTS, ids=lambda kind: kind.field)
def test_the_space_and_the_request_name_each_layout_by_its_field(kind: LayoutKind) -> None:
    space = load_space(default_space_path())
    (parameter,) = [p for p in space.parameters if p.key == kind.key]
    assert parameter.name == kind.field and LAYOUT_PROBLEMS[kind.key] == kind.problem
    assert TrialSettings(**{kind.field: 2}).layout_config() == kind.config(2)


def test_the_space_offers_the_degrees_the_layouts_checks_allow() -> None:
    work = Workload(load_builtin_model("llama-2-7b"), ClusterSpec(gpus_per_node=4, nodes=2))
    hpz, autotp = (kind for kind in LAYOUTS if kind.field in ("hpz_partition_size", "tensor_parallel"))
    assert [d for d in (1, 2, 4, 8) if hpz.problem(work, d) is None] == [1, 2, 4]  # within a node of 4
    assert autotp.problem(work, 8) is not None and autotp.problem(work, 2) is None
