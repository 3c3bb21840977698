#!/usr/bin/env bash
# dstune's first contact with a GPU, in one command of at most 9 minutes on one H100 80 GB (or any single GPU): the
# machine's own image (torch with CUDA) plus the wheels bench/gpu_bundle.sh put in .whl (DeepSpeed, pydantic and the
# rest dstune imports; at most 64 MiB). Sized to the card it reads from the device. Every step appends to $OUT
# (validation.jsonl: one line per step; validation.log: everything printed; gpu_terms_check.md/.json; born_on_cuda.json),
# so a run cut short keeps what it measured. Steps (bench/gpu_validation.py says what each checks against what):
# preflight, a forked rank on CUDA, ZeRO-0..3 against max_memory_allocated/reserved with phase peaks and tokens/s, an
# OOM boundary pair chosen from the estimator on this card, NVML against the context term, the transformers model
# path, FusedAdam's build where nvcc and g++ are, then born_on_cuda if time is left.
#   bash bench/gpu_validation.sh             # on the GPU machine, after: bash bench/gpu_bundle.sh (here)
#   bash bench/gpu_validation.sh --dry-run   # any machine: every step on CPU ranks with tiny models (CI runs it)
set -uo pipefail
start=$SECONDS
dry=""
[ "${1:-}" = "--dry-run" ] && dry="--dry-run"
out="${OUT:-bench/results/gpu_validation}"
mkdir -p "$out"
log="$out/validation.log"
: >"$out/validation.jsonl"
python="${PYTHON:-python3}"  # the machine's own (the image's torch); a test passes its interpreter
total=540  # the 9 minutes; every step gets what is left, less what the later steps need
if [ -z "$dry" ]; then
  if [ -d .whl ]; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      >>"$log" 2>&1 || echo "wheel install failed: see $log"
  fi
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" TORCH_EXTENSIONS_DIR=/tmp/torch_extensions
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv >>"$log" 2>&1
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" DS_ACCELERATOR=cpu
fi
export PYTHONUNBUFFERED=1
left() {  # seconds left once $1 are kept for the later steps (a dry run: 300 s a step, it measures no time)
  if [ -n "$dry" ]; then echo 300; else echo $((total - (SECONDS - start) - $1)); fi
}

# step NAME KEEP COMMAND...: run COMMAND with what is left less KEEP seconds (skipped under 20 s), output to the log
step() {
  local name=$1 keep=$2
  shift 2
  local budget
  budget=$(left "$keep")
  if [ "$budget" -lt 20 ]; then
    echo "{\"step\": \"$name\", \"status\": \"skipped\", \"why\": \"out of time\"}" >>"$out/validation.jsonl"
    return
  fi
  echo "== $name (budget ${budget} s, at $((SECONDS - start)) s)" | tee -a "$log"
  timeout "$budget" "$@" >>"$log" 2>&1
  local code=$?
  [ "$code" -eq 0 ] || echo "{\"step\": \"$name\", \"status\": \"exit $code\"}" >>"$out/validation.jsonl"
}

py=("$python" bench/gpu_validation.py --out "$out" $dry)
echo "card: $("${py[@]}" card 2>>"$log" | tail -1) bytes" | tee -a "$log"

step preflight 480 "${py[@]}" preflight
step forked 400 "${py[@]}" forked --budget-s 90
step stages 240 "${py[@]}" stages --budget-s 140
step oom-pair 170 "${py[@]}" oom-pair --budget-s 80
step nvml 150 "${py[@]}" nvml
step transformers 100 "${py[@]}" transformers --budget-s 60
step fused-adam 20 "${py[@]}" fused-adam --budget-s 60
step born-on-cuda 0 "$python" bench/born_on_cuda.py "$out/born_on_cuda.json" $dry
echo "validation took $((SECONDS - start)) s" | tee -a "$log"
