#!/usr/bin/env bash
# On the GPU machine: install the carried wheels, then run the named steps (default: cells tests, one call of
# about 7 minutes, for a session lent 15 minutes of device time in all).
#
#   here:    bash scripts/gpu_wheels.sh                                  (fills .whl/, git-ignored)
#   device:  run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=540)
#
# Steps:
#   cells    the speed table's cells that matter: the Llama-2-7B shape in 4-bit at 4K, 32K and 128K tokens,
#            vanilla, LM-Infinite and LM-Infinite + recall -> docs/benchmarks.md's speed_gpu table (about 3 minutes)
#   tests    the CUDA tests (tests/test_lminfinite_cuda.py, tests/test_app_cuda.py: the library, and the app in
#            4-bit, its engine and `python app.py --load-in-4bit` over HTTP) -> cuda_tests.log (about 3 minutes)
#   kernels  the window-span kernels side by side at Llama-2-7B's shape, c = 4·L -> docs/benchmarks.md's window_span_gpu table
#   speed    the whole ladder, 4K to 128K, with truncation too (two calls' worth)
#   recall   one layer's recall in a decode step at Llama-2-7B's heads, 4K to 128K middle tokens, through PyTorch's
#            operators, through Triton's kernels and through them over int8 key codes (keeping 32 candidates per pool
#            of 1,024 keys, 16 per block of 128, and with every head sent to the full scan), eager and from a CUDA
#            graph, and the coded path's launches one by one -> docs/benchmarks.md's recall_kernel_gpu tables (about a
#            minute)
#   profile  a 4K prefill, vanilla against LM-Infinite, side by side, operators per layer counted, and operator
#            by operator -> profile_prefill.log (under a minute once the model is made)
# Logs and results go to $OUT (they come back to this machine): gpu.txt, the logs, the table files and docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
if (($#)); then STEPS=("$@"); else STEPS=(cells tests); fi

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
results=(docs/benchmarks.md)  # what comes back besides the logs (8 files at most)
for step in "${STEPS[@]}"; do
  case $step in
    tests|library)  # the library's tests in four workers (FlexAttention compiles side by side); the app's alone, as
            # one of them takes all free GPU memory on purpose ("library": the library's only)
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
      timeout 200 python3 -m pytest -q -p no:cacheprovider -rs $workers tests/test_lminfinite_cuda.py 2>&1 \
        | tee "$OUT/cuda_tests.log"; rc=${PIPESTATUS[0]}
      [[ $step == library ]] || timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_app_cuda.py 2>&1 \
        | tee -a "$OUT/cuda_tests.log"; rc=$(( rc || PIPESTATUS[0] )) ;;
    cells)
      timeout 200 python3 -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 \
        --contexts 4096,32768,131072 --methods lminfinite,lminfinite-topk,vanilla --decode-tokens 8 \
        --repeat-budget-s 8 --deadline-s 150 --tag speed_gpu --readme 2>&1 | tee "$OUT/speed_gpu.log"; rc=${PIPESTATUS[0]}
      results+=(benchmarks/results/speed_gpu.{json,md,png}) ;;
    kernels)
      timeout 120 python3 -m benchmarks.window_span --device cuda --window 4096 --heads 32 --head-dim 128 \
        --readme 2>&1 | tee "$OUT/window_span_gpu.log"; rc=${PIPESTATUS[0]}
      results+=(benchmarks/results/window_span_gpu.{json,md}) ;;
    speed)
      timeout 540 python3 -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 \
        --max-context 131072 --decode-tokens 8 --deadline-s 420 --tag speed_gpu --readme 2>&1 | tee "$OUT/speed_gpu.log"; rc=${PIPESTATUS[0]}
      results+=(benchmarks/results/speed_gpu.{json,md,png}) ;;
    recall)
      timeout 120 python3 -m benchmarks.recall_kernel --readme 2>&1 | tee "$OUT/recall_kernel_gpu.log"; rc=${PIPESTATUS[0]}
      results+=(benchmarks/results/recall_kernel_gpu.{json,md}) ;;
    profile)
      timeout 120 python3 -m benchmarks.profile_prefill --model random-7b --device cuda --load-in-4bit \
        --window 4096 --context 4096 2>&1 | tee "$OUT/profile_prefill.log"; rc=${PIPESTATUS[0]} ;;
    *) echo "unknown step $step (cells, tests, kernels, speed, recall, profile)"; exit 2 ;;
  esac
  status=$(( status || rc ))
done
cp "${results[@]}" "$OUT"/ 2>/dev/null
exit "$status"
