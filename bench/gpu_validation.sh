#!/usr/bin/env bash
# GPU validation for a session lent the H200 (device tool): estimated vs measured memory (max_memory_allocated) and
# throughput on CUDA, for the configs of bench/estimator_accuracy.py. Prepare the wheels first (bench/results/README.md),
# then call the device tool with carry [".whl"] and: bash bench/gpu_validation.sh
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
out="${OUT:-bench/results}"
python3 bench/estimator_accuracy.py --device cuda --seq-len 1024 --out "$out/estimator_accuracy_cuda.md"
python3 bench/born_on_cuda.py "$out/born_on_cuda.json"
