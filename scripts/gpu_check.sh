#!/usr/bin/env bash
# On the GPU machine (issue 12): install the carried wheels, then run the CUDA tests and the GPU speed table.
#
#   here:    bash scripts/gpu_wheels.sh                                  (fills .whl/, git-ignored)
#   device:  run(command="bash scripts/gpu_check.sh tests", carry=[".whl"], timeout_s=600)
#            run(command="bash scripts/gpu_check.sh speed", carry=[".whl"], timeout_s=600)
#
# Each step is one 10-minute device call (no argument: tests, then the hint for speed). Logs and results go to $OUT (they come
# back to this machine): gpu.txt, cuda_tests.log, speed_gpu.log and the speed_gpu table files; the speed step
# also refreshes README.md between <!-- speed_gpu:begin --> and <!-- speed_gpu:end --> (copied to $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
STEP=${1:-tests}

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
if [[ $STEP == all || $STEP == tests ]]; then
  timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/test_lminfinite_cuda.py 2>&1 | tee "$OUT/cuda_tests.log"
  status=${PIPESTATUS[0]}
fi
if [[ $STEP == all || $STEP == speed ]]; then
  timeout 540 python3 -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 \
    --max-context 131072 --tag speed_gpu --readme 2>&1 | tee "$OUT/speed_gpu.log"
  status=$(( status || PIPESTATUS[0] ))
  cp README.md benchmarks/results/speed_gpu.* "$OUT"/ 2>/dev/null
fi
[[ $STEP == tests ]] && echo "next device call: bash scripts/gpu_check.sh speed (carry .whl)"
exit "$status"
