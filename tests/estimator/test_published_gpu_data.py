"""The published GPU runs ``bench/published_gpu.py`` scores (``bench/data/published_gpu.yaml``): every row names its
source and quotes it, says what was measured and in which unit, and describes a config dstune can estimate (a known
GPU type, a model the bench finds, an outcome of fits or oom); the bench turns a row into ``dstune estimate``'s flags
(ALST's tiling as ArcticTraining runs it)."""

from __future__ import annotations

import math

import pytest
import yaml
from bench_module import BENCH, load_bench

from tuner.workload import GPU_TYPES, preset_names

ROWS = yaml.safe_load((BENCH / "data" / "published_gpu.yaml").read_text())
KINDS = {"allocated", "reserved", "nvidia-smi", "unspecified", "none"}


def test_at_least_thirty_rows_with_unique_ids() -> None:
    assert len(ROWS) >= 30
    assert len({row["id"] for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row["id"] for row in ROWS])
def test_each_row_is_sourced_and_estimable(row: dict) -> None:
    assert row["url"].startswith("https://") and row["quote"] and row["source"]
    assert row["gpu_type"] in GPU_TYPES and row["outcome"] in ("fits", "oom")
    assert row["measured"] in KINDS
    assert (row["figure"] is None) == (row["unit"] is None) == (row["measured"] == "none")
    configs = BENCH / "configs"
    assert (
        (configs / row["model"]).is_dir()
        or (configs / f"{row['model']}.json").exists()
        or row["model"] in preset_names()
    )
    assert row["seq_len"] % row["sequence_parallel"] == 0
    assert row["gpus"] * row["nodes"] % row["sequence_parallel"] == 0


def test_alst_tiling_as_arctic_training_runs_it() -> None:
    bench = load_bench("published_gpu")
    row = next(row for row in ROWS if row["id"] == "run-h100-sp8-llama-8b-3800000")
    flags = bench.flags_of(row, None)
    local = 3_800_000 // 8
    assert flags.tiled_mlp == math.ceil(local / 4096)  # DeepSpeed's ALST tutorial: ceil(seqlen / hidden)
    assert flags.liger and flags.tiled_loss == 1  # ArcticTraining's liger model type: Liger's kernels and loss
    assert (flags.gpu_type, flags.layouts["sequence_parallel"], flags.offload_checkpoints) == ("h100-80gb", 8, True)
    plain = bench.flags_of(row, None, liger=False)  # as scored before --liger: Liger's loss as a tiled loss
    assert not plain.liger and plain.tiled_loss == math.ceil(local * 128_256 * 4 / 2**30)  # 1 GiB of fp32 logits
    baseline = bench.flags_of(next(row for row in ROWS if "no-liger" in row["id"]), None)
    assert not baseline.liger


def test_a_rows_optimizer_and_master_weights_reach_the_flags() -> None:
    bench = load_bench("published_gpu")
    rows = {row["id"]: row for row in ROWS}
    full = bench.flags_of(rows["deepspeedexamples-bf16-master-weight-6.86b-bf16-full"], None)
    assert full.bf16_master_weights and full.bf16_optimizer_states and full.model.endswith("mha_7b.json")
    override = bench.ds_override(rows["deepspeedexamples-bf16-master-weight-6.86b-bf16-full"])
    assert override["torch_autocast"] == {"enabled": True, "dtype": "torch.bfloat16"}  # the example's bf16_full.json
    assert override["zero_optimization"]["memory_efficient_linear"] is False  # its model is built outside zero.Init
    muon = bench.flags_of(rows["deepspeed-muon-blog-qwen2.5-3b-muon"], None)
    assert (muon.optimizer, muon.attention, muon.bf16_master_weights) == ("muon", "flash", False)


def test_arctic_trainings_nv_figure_is_compared_with_the_drivers_memory_counted(tmp_path) -> None:
    """ArcticTraining's ``NV`` is NVML's v1 ``used`` (total - free over the whole card): the estimate it is compared
    with carries what the driver keeps beyond CUDA's ``total_memory`` (nvidia-smi's 81,559 MiB against 81,082 on an
    H100), and a figure measured on another stack stays out of the like-with-like medians."""
    bench = load_bench("published_gpu")
    rows = {row["id"]: row for row in ROWS}
    nv = rows["run-h100-sp64-llama-70b-10000000"]
    assert nv["nvml_api"] == "v1"
    scored = bench.score(nv, tmp_path)
    assert scored.compared() - scored.total == (81_559 - 81_082) * 2**20
    apart = bench.score(rows["run-h100-sp32-qwen3-32b-7000000"], tmp_path)
    assert "pt-2.4" in apart.row["quote"] and apart.row["figure_stack"]
    report = bench.render([scored, apart])
    assert "| nvidia-smi | 1 |" in report and "- run-h100-sp32-qwen3-32b-7000000:" in report
