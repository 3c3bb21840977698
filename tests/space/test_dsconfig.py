"""DeepSpeed config helpers: shortcut flags, loading, merging (the file wins), DeepSpeed's validation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.estimator import ConfigError
from tuner.space.dsconfig import load_ds_config, merge_configs, shortcut_config, validate_with_deepspeed


def test_shortcut_bf16_stage0_has_no_offload() -> None:
    config = shortcut_config(2, 4, "bf16", 0, "none", "none")
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_accumulation_steps"] == 4
    assert config["bf16"] == {"enabled": True}
    assert "fp16" not in config
    assert config["zero_optimization"] == {"stage": 0}
    assert config["optimizer"] == {"type": "AdamW", "params": {"lr": 1e-4}}


def test_shortcut_fp16_and_fp32_precision_sections() -> None:
    fp16 = shortcut_config(1, 1, "fp16", 1, "none", "none")
    assert fp16["fp16"] == {"enabled": True}
    assert "bf16" not in fp16
    fp32 = shortcut_config(1, 1, "fp32", 1, "none", "none")
    assert "fp16" not in fp32
    assert "bf16" not in fp32


def test_shortcut_offload_sections() -> None:
    config = shortcut_config(1, 1, "bf16", 3, "cpu", "nvme", nvme_path="/local/nvme")
    zero = config["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"] == {"device": "cpu"}
    assert zero["offload_param"] == {"device": "nvme", "nvme_path": "/local/nvme"}


def test_shortcut_returns_fresh_dicts() -> None:
    first = shortcut_config(1, 1, "bf16", 2, "cpu", "none")
    first["optimizer"]["params"]["lr"] = 1.0
    assert shortcut_config(1, 1, "bf16", 2, "cpu", "none")["optimizer"]["params"]["lr"] == 1e-4


def test_merge_override_wins_and_nested_dicts_merge() -> None:
    base = shortcut_config(1, 1, "bf16", 1, "cpu", "none")
    override = {
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 1000},
        "gradient_accumulation_steps": 8,
    }
    merged = merge_configs(base, override)
    assert merged["zero_optimization"] == {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "reduce_bucket_size": 1000,
    }
    assert merged["gradient_accumulation_steps"] == 8
    assert merged["bf16"] == {"enabled": True}
    assert merged["optimizer"]["params"]["lr"] == 1e-4


def test_merge_deep_and_non_dict_replaces() -> None:
    base = {"a": {"b": {"c": 1, "d": 2}}, "e": {"f": 1}, "g": [1, 2]}
    override = {"a": {"b": {"c": 10}}, "e": 5, "g": [3]}
    assert merge_configs(base, override) == {"a": {"b": {"c": 10, "d": 2}}, "e": 5, "g": [3]}
    assert merge_configs({"x": 1}, {"x": {"y": 2}}) == {"x": {"y": 2}}


def test_merge_leaves_inputs_untouched() -> None:
    base = {"zero_optimization": {"stage": 1}}
    override = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    merged = merge_configs(base, override)
    merged["zero_optimization"]["offload_optimizer"]["device"] = "nvme"
    assert base == {"zero_optimization": {"stage": 1}}
    assert override == {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}


def test_load_ds_config(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert load_ds_config(path) == {"zero_optimization": {"stage": 2}}
    assert load_ds_config(str(path)) == {"zero_optimization": {"stage": 2}}


@pytest.mark.parametrize("content", ["{broken", "[1, 2]", '"text"', ""])
def test_load_ds_config_rejects_bad_files(tmp_path: Path, content: str) -> None:
    path = tmp_path / "ds.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_ds_config(path)
    assert caught.value.field == "ds-config"


def test_load_ds_config_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_ds_config(tmp_path / "absent.json")
    assert caught.value.field == "ds-config"
    assert "no such file" in str(caught.value)


@pytest.fixture
def deepspeed_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make DeepSpeed importable without a GPU (skips when DeepSpeed is not installed)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    pytest.importorskip("deepspeed")


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_validate_with_deepspeed_accepts_shortcut_configs() -> None:
    for stage, opt, param in ((0, "none", "none"), (2, "cpu", "none"), (3, "cpu", "cpu")):
        validate_with_deepspeed(shortcut_config(2, 4, "bf16", stage, opt, param), world_size=8)


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_validate_with_deepspeed_names_unknown_zero_key() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_with_deepspeed({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}}, world_size=1)
    assert caught.value.field == "zero_optimization.reduce_bucket_sise"
    assert "reduce_bucket_sise" in str(caught.value)


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_validate_with_deepspeed_names_nested_offload_key() -> None:
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": True}}}
    with pytest.raises(ConfigError) as caught:
        validate_with_deepspeed(config, world_size=1)
    assert caught.value.field == "zero_optimization.offload_param.pin_memroy"


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_validate_with_deepspeed_names_other_sections() -> None:
    with pytest.raises(ConfigError) as caught:
        validate_with_deepspeed({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True, "bogus": 1}}, 1)
    assert caught.value.field == "bf16.bogus"


@pytest.mark.usefixtures("deepspeed_on_cpu")
def test_validate_with_deepspeed_checks_batch_arithmetic_at_world_size() -> None:
    config = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    validate_with_deepspeed(config, world_size=8)
    with pytest.raises(ConfigError):
        validate_with_deepspeed(config, world_size=4)


def test_validate_with_deepspeed_raises_import_error_without_deepspeed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    monkeypatch.setitem(sys.modules, "deepspeed.runtime", None)
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.config", None)
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.zero.config", None)
    with pytest.raises(ImportError):
        validate_with_deepspeed({}, world_size=1)


def test_module_does_not_import_deepspeed() -> None:
    import subprocess
    import sys

    code = "import sys, tuner.space.dsconfig, tuner.cli; print('deepspeed' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "False"


def test_validating_with_deepspeed_writes_nothing_to_stdout() -> None:
    """``dstune best > ds_config.json`` must hold JSON alone: DeepSpeed's logger writes to the stdout it finds when
    first imported (its accelerator warning, without DS_ACCELERATOR set)."""
    code = (
        "from tuner.space.dsconfig import validate_with_deepspeed; "
        "validate_with_deepspeed({'train_micro_batch_size_per_gpu': 1, 'zero_optimization': {'stage': 2}}, 2); "
        "from deepspeed.utils.logging import logger; logger.warning('a later warning')"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == ""
    assert "a later warning" in done.stderr
