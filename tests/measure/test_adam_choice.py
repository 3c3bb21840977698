"""The default optimizer trains on a node without compilers: DeepSpeed's fused op where it is prebuilt, built already
or buildable, torch's Adam otherwise (before, every trial of the default space failed in deepspeed.initialize on a
slim CUDA image: FusedAdam's JIT build needs nvcc, CPU-Adam's g++)."""

from __future__ import annotations

from pathlib import Path

from tuner.measure.rank.adam_choice import adam_fallback, toolchain_missing, with_torch_adam

ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 2}}
OFFLOAD = {**ADAMW, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def slim(name: str) -> str | None:
    """A CUDA runtime image: no nvcc, no g++, pip's ninja."""
    return "/venv/bin/ninja" if name == "ninja" else None


def full(name: str) -> str | None:
    return f"/usr/bin/{name}"


def test_a_slim_cuda_node_trains_the_default_space_with_torchs_adam(tmp_path: Path) -> None:
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path), "CUDA_HOME": str(tmp_path / "no-cuda")}
    why = adam_fallback("cuda", ADAMW, env, prebuilt=(), which=slim)
    assert why is not None and why.startswith("fused_adam") and "nvcc" in why and "g++" in why
    offloaded = adam_fallback("cuda", OFFLOAD, env, prebuilt=(), which=slim)
    assert offloaded is not None and offloaded.startswith("cpu_adam") and "nvcc" not in offloaded
    assert with_torch_adam(ADAMW)["optimizer"] == {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}
    assert "torch_adam" not in ADAMW["optimizer"]["params"]  # the trial's own config is untouched


def test_deepspeeds_op_stays_where_it_is_prebuilt_built_or_buildable(tmp_path: Path) -> None:
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path), "CUDA_HOME": str(tmp_path / "cuda")}
    assert adam_fallback("cuda", ADAMW, env, prebuilt={"fused_adam"}, which=slim) is None  # DS_BUILD_FUSED_ADAM=1
    (tmp_path / "fused_adam").mkdir()
    (tmp_path / "fused_adam" / "fused_adam.so").write_bytes(b"")
    assert adam_fallback("cuda", ADAMW, env, prebuilt=(), which=slim) is None  # JIT-built by an earlier run
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    (tmp_path / "cuda" / "bin" / "nvcc").write_text("")
    assert toolchain_missing("fused_adam", "cuda", env, which=full) in (
        [],
        ["Python.h (the Python development headers)"],
    )
    assert (
        adam_fallback("cuda", {**ADAMW, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, env, (), slim)
        is None
    )
