#!/usr/bin/env bash
# The wheels bench/gpu_validation.sh installs on a GPU machine without network access (its image has torch with CUDA, transformers,
# psutil, ninja, numpy, msgpack, einops, py-cpuinfo, nvidia-ml-py; nothing can be downloaded there), into .whl at the
# repository root: DeepSpeed (built here as a pure-Python wheel: on Linux it ships as an sdist only; its ops are
# built there, at run time, with the image's nvcc), pydantic and pydantic-settings with their parts, python-dotenv,
# google-re2, typing-extensions (the image's version is unknown) and the transformers dstune is tested against, each
# at this virtualenv's version, for CPython 3.12 on x86-64. Then, with the device tool:
#   run(command="bash bench/gpu_validation.sh", carry=[".whl"], timeout_s=570)
# and commit what comes back under $OUT into bench/results/gpu_validation/.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
rm -rf .whl && mkdir .whl
names=(hjson pydantic pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv google-re2
  typing-extensions transformers)
pinned=$("$python" - "${names[@]}" <<'PY'
import sys
from importlib import metadata

print(" ".join(f"{name}=={metadata.version(name)}" for name in sys.argv[1:]))
PY
)
# shellcheck disable=SC2086  # one word per requirement
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pinned
deepspeed=$("$python" -c "from importlib import metadata; print(metadata.version('deepspeed'))")
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w .whl "deepspeed==$deepspeed"
ls .whl/deepspeed-*-py3-none-any.whl >/dev/null  # a platform wheel would hold ops built for this machine
size=$(du -sm .whl | cut -f1)
echo "$(ls .whl | wc -l) wheels, ${size} MiB in .whl"
[ "$size" -le 60 ] || { echo "over the 64 MiB a device call carries" >&2; exit 1; }
