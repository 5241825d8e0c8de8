#!/usr/bin/env bash
# On the GPU machine (issue 12): install the carried wheels, then run the named steps (default: tests kernels).
#
#   here:    bash scripts/gpu_wheels.sh                                  (fills .whl/, git-ignored)
#   device:  run(command="bash scripts/gpu_check.sh tests kernels", carry=[".whl"], timeout_s=600)
#            run(command="bash scripts/gpu_check.sh speed", carry=[".whl"], timeout_s=600)
#
# Steps (each fits its share of one 10-minute device call):
#   tests    the CUDA tests (tests/test_lminfinite_cuda.py, tests/test_app_cuda.py: the library, and the app in
#            4-bit, its engine and `python app.py --load-in-4bit` over HTTP) -> cuda_tests.log
#   kernels  the window-span kernels side by side at Llama-2-7B's shape, c = 4·L -> README's window_span_gpu table
#   speed    the Llama-2-7B shape in 4-bit from 4K to 128K tokens -> README's speed_gpu table
# Logs and results go to $OUT (they come back to this machine): gpu.txt, the logs, the table files and README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
if (($#)); then STEPS=("$@"); else STEPS=(tests kernels); fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "no wheels: run scripts/gpu_wheels.sh here and carry .whl"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 \
  HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, bitsandbytes as b; print('torch', torch.__version__, '| transformers', \
transformers.__version__, '| bitsandbytes', b.__version__, '|', torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/gpu.txt"

status=0
for step in "${STEPS[@]}"; do
  case $step in
    tests)  # the library's tests in four workers (FlexAttention compiles side by side); the app's alone, as one
            # of them takes all free GPU memory on purpose
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
      timeout 240 python3 -m pytest -q -p no:cacheprovider -rs $workers tests/test_lminfinite_cuda.py 2>&1 \
        | tee "$OUT/cuda_tests.log"; rc=${PIPESTATUS[0]}
      timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/test_app_cuda.py 2>&1 \
        | tee -a "$OUT/cuda_tests.log"; rc=$(( rc || PIPESTATUS[0] )) ;;
    kernels)
      timeout 120 python3 -m benchmarks.window_span --device cuda --window 4096 --heads 32 --head-dim 128 \
        --readme 2>&1 | tee "$OUT/window_span_gpu.log"; rc=${PIPESTATUS[0]} ;;
    speed)
      timeout 540 python3 -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 \
        --max-context 131072 --decode-tokens 8 --deadline-s 420 --tag speed_gpu --readme 2>&1 | tee "$OUT/speed_gpu.log"; rc=${PIPESTATUS[0]} ;;
    *) echo "unknown step $step (tests, kernels, speed)"; exit 2 ;;
  esac
  status=$(( status || rc ))
done
cp README.md benchmarks/results/speed_gpu.* benchmarks/results/window_span_gpu.* "$OUT"/ 2>/dev/null
[[ " ${STEPS[*]} " != *" speed "* ]] && echo "next device call: bash scripts/gpu_check.sh speed (carry .whl)"
exit "$status"
