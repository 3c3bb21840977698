#!/usr/bin/env bash
# GPU validation for a session lent the H200 (device tool), in at most 8 minutes of device time: the estimate's CUDA
# terms against torch.cuda.max_memory_allocated / max_memory_reserved and NVML process memory, and predicted against
# measured throughput, for about 20 configs (bench/gpu_terms_check.py, which stops starting runs at its budget and
# writes its report after every run); then, if time is left, bench/born_on_cuda.py. Prepare the wheels first
# (bench/results/README.md), then call the device tool with carry [".whl"], timeout_s=540, and:
#   bash bench/gpu_validation.sh
# Results land under $OUT (bench/results when run by hand): gpu_terms_check.md/.json, born_on_cuda.json.
set -euo pipefail
start=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'deepspeed', deepspeed.__version__)"
out="${OUT:-bench/results}"
budget=$((400 - (SECONDS - start)))
timeout $((budget + 60)) python3 bench/gpu_terms_check.py --out "$out" --budget-s "$budget" || echo "gpu_terms_check exited $?"
left=$((470 - (SECONDS - start)))
if [ "$left" -gt 120 ]; then
  timeout "$left" python3 bench/born_on_cuda.py "$out/born_on_cuda.json" || echo "born_on_cuda exited $?"
fi
echo "validation took $((SECONDS - start)) s"
