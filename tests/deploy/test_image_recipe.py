"""deploy/Dockerfile builds DeepSpeed's Adam ops into the image for the target GPUs (no trial compiles at run time),
on a CUDA development base (nvcc, and Python.h and g++ installed), with dstune's run extra and the versions this
repository is tested with. No image builder runs where the tests run: this reads the recipe; it was not built."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE = (ROOT / "deploy" / "Dockerfile").read_text()


def arg(name: str) -> str:
    found = re.search(rf"^ARG {name}=(.+)$", RECIPE, re.M)
    assert found, name
    return found.group(1).strip('"')


def test_the_image_prebuilds_deepspeeds_adam_ops_for_the_target_gpus_on_a_cuda_devel_base() -> None:
    assert re.search(r"nvidia/cuda:[\d.]+-(cudnn-)?devel-", arg("CUDA_IMAGE"))  # nvcc is in devel images only
    assert {"8.0", "9.0"} <= set(arg("TORCH_CUDA_ARCH_LIST").split(";"))  # A100 and H100/H200 at least
    build = next(line for line in RECIPE.split("\nRUN ") if "pip install --no-build-isolation" in line)
    for flag in ("DS_BUILD_FUSED_ADAM=1", "DS_BUILD_CPU_ADAM=1", "DS_ACCELERATOR=cuda", "TORCH_CUDA_ARCH_LIST"):
        assert flag in build, flag
    assert "python3-dev" in RECIPE and "g++" in RECIPE and "ninja" in RECIPE  # Python.h and the compilers
    assert '"/src/dstune[run]"' in RECIPE
    assert RECIPE.index("torch==") < RECIPE.index("deepspeed==${DEEPSPEED_VERSION}")  # torch's CUDA build first


def test_the_image_pins_what_this_repository_is_tested_with() -> None:
    assert arg("DEEPSPEED_VERSION") == metadata.version("deepspeed")
    assert arg("TORCH_VERSION") == metadata.version("torch").split("+")[0]
