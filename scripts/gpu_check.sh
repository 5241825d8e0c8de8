#!/usr/bin/env bash
# On the GPU machine: install the carried wheels, then run the named steps (default: cells tests, one call of
# about 7 minutes, for a session lent 15 minutes of device time in all).
#
#   here:    bash scripts/gpu_wheels.sh                                  (fills .whl/, git-ignored)
#   device:  run(command="bash scripts/gpu_check.sh", carry=[".whl"], timeout_s=590)
#
# Steps:
#   cells    the speed table's cells that matter: the Llama-2-7B shape in 4-bit at 4K, 32K and 128K tokens,
#            vanilla, LM-Infinite and LM-Infinite + recall, then at 2K (a quoted answer's reader: decoding before
#            the window is full, through a CUDA graph too; first cut if time runs short) -> docs/benchmarks.md's
#            speed_gpu table (about 3 minutes); after a recall step, with the recall way that step found fastest
#   tests    the CUDA tests (tests/test_lminfinite_cuda.py, tests/test_app_cuda.py: the library, and the app in
#            4-bit, its engine and `python app.py --load-in-4bit` over HTTP) -> cuda_tests.log (about 3 minutes)
#   kernels  the window-span kernels side by side at Llama-2-7B's shape, c = 4·L -> docs/benchmarks.md's
#            window_span_gpu table
#   speed    the whole ladder, 4K to 128K, with truncation too (two calls' worth)
#   recall   one layer's recall in a decode step at Llama-2-7B's heads, 4K to 128K middle tokens, through PyTorch's
#            operators and through Triton's kernels (a block a program, and 8 or 32 blocks a program with a running
#            k best), eager and from a CUDA graph, then the step's window through each kernel (and a step's before
#            the window is full) -> docs/benchmarks.md's recall_kernel_gpu tables (about a minute)
#   profile  a 4K prefill, vanilla against LM-Infinite, side by side, operators per layer counted, and operator
#            by operator -> profile_prefill.log (under a minute once the model is made)
# Logs and results go to $OUT (they come back to this machine): gpu.txt (with each step's time), the logs (the
# kernels' builds in the background: prebuild.log), the table files and docs/benchmarks.md, copied after each
# step, so a call stopped from outside still brings back what the steps before it wrote.
#
# The steps share one budget from the script's start (GPU_CHECK_BUDGET_S, default 570 s: a device call's 590 less
# the copy back). Each runs under a timeout of what it asks for (WANT), but never of what the steps after it need
# at least (FLOOR): a step that hangs, or kernels that take longer to build than they did, costs that step, not the
# ones after it.
# GPU_CHECK_PLAN=1 prints each step's timeout, were every step to run to its timeout, and runs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
if (($#)); then STEPS=("$@"); else STEPS=(cells tests); fi
BUDGET_S=${GPU_CHECK_BUDGET_S:-570}
declare -A WANT=([tests]=390 [library]=240 [cells]=200 [kernels]=120 [speed]=540 [recall]=100 [profile]=120)
declare -A FLOOR=([tests]=210 [library]=120 [cells]=150 [kernels]=60 [speed]=300 [recall]=60 [profile]=60)
APP_WANT=150 APP_FLOOR=90  # the tests step: the library's tests, then the app's

for step in "${STEPS[@]}"; do
  [[ -v "WANT[$step]" ]] || { echo "unknown step $step (${!WANT[*]})"; exit 2; }
done

# limit WANT ELAPSED STEP_INDEX: seconds step STEP_INDEX may run, ELAPSED seconds into the budget
limit() {
  local want=$1 elapsed=$2 later=0 i
  for ((i = $3 + 1; i < ${#STEPS[@]}; i++)); do later=$(( later + FLOOR[${STEPS[i]}] )); done
  local left=$(( BUDGET_S - elapsed - later ))
  (( want < left )) && echo "$want" || echo "$(( left > 0 ? left : 0 ))"
}

# deadline SECONDS MARGIN: when a speed benchmark under a timeout of SECONDS starts no more cells, so that it still
# writes its table: MARGIN seconds before the timeout, or a third of it where that is more
deadline() { echo "$(( $1 - $2 > $1 * 2 / 3 ? $1 - $2 : $1 * 2 / 3 ))"; }

if [[ ${GPU_CHECK_PLAN:-} ]]; then
  elapsed=0
  for i in "${!STEPS[@]}"; do
    seconds=$(limit "${WANT[${STEPS[i]}]}" "$elapsed" "$i")
    echo "${STEPS[i]} $seconds"
    elapsed=$(( elapsed + seconds ))
  done
  exit 0
fi

mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "no wheels: run scripts/gpu_wheels.sh here and carry .whl"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 \
  HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers, bitsandbytes as b; print('torch', torch.__version__, '| transformers', \
transformers.__version__, '| bitsandbytes', b.__version__, '|', torch.cuda.get_device_name())"
} 2>&1 | tee "$OUT/gpu.txt"

# Meanwhile, in the background: the check `auto` runs before it recalls through Triton's kernels, for each dtype and
# head size the steps and tests use, so that the check's builds land in Triton's disk cache, not inside a timed step.
# Nice'd: the steps' host threads keep their cores.
prebuilds=()
for dtype in bfloat16 float16 float32; do
  for dim in 128 64; do
    nice -n 10 python3 -c "import torch; from lminfinite import recall_kernel; print('$dtype, head size $dim:', \
recall_kernel.resolve('auto', torch.device('cuda', 0), torch.$dtype, $dim), flush=True)" \
      >> "$OUT/prebuild.log" 2>&1 & prebuilds+=($!)
  done
done

status=0
results=(docs/benchmarks.md)  # what comes back besides the logs (8 files at most)
for i in "${!STEPS[@]}"; do
  step=${STEPS[i]}
  seconds=$(limit "${WANT[$step]}" "$SECONDS" "$i")
  if (( seconds < 30 )); then  # (timeout 0 would wait for ever)
    echo "$step: skipped, $seconds s of the budget left for it" | tee -a "$OUT/gpu.txt"; status=1; continue
  fi
  step_started=$SECONDS
  case $step in
    tests|library)  # the library's tests in eight workers: FlexAttention's and Triton's kernels build side by side;
            # the app's alone, as one of them takes all free GPU memory on purpose ("library": the library's only)
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
      # a test that hangs (a CUDA graph, a lock) fails alone and names itself, rather than taking the step's time
      per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout 180")
      own=$seconds; [[ $step == library ]] || own=$(( seconds - APP_FLOOR ))  # the app's tests keep their floor
      own=$(( own < ${WANT[library]} ? own : ${WANT[library]} ))
      # -v: each test's name and result as it ends (in 8 workers, -q named no failure of a run cut at its timeout);
      # SIGINT 10 s before its share ends, so pytest still prints its summary; killed at the share's end (a run that
      # reached its last test on 2026-11-29 hung in its workers' teardown)
      timeout -s INT -k 10 "$(( own - 10 ))" python3 -m pytest -v -p no:cacheprovider -rfEs $workers $per_test \
        tests/test_lminfinite_cuda.py 2>&1 | tee "$OUT/cuda_tests.log"; rc=${PIPESTATUS[0]}
      if [[ $step == tests ]]; then
        left=$(( seconds - (SECONDS - step_started) ))
        if (( left < 30 )); then
          echo "the app's tests: skipped, $left s of the step left" | tee -a "$OUT/cuda_tests.log"; rc=1
        else
          timeout -s INT -k 10 "$(( (left < APP_WANT ? left : APP_WANT) - 10 ))" python3 -m pytest -v -p no:cacheprovider \
            -rfEs $per_test tests/test_app_cuda.py 2>&1 | tee -a "$OUT/cuda_tests.log"; rc=$(( rc || PIPESTATUS[0] ))
        fi
      fi ;;
    cells)
      # after a recall step in this call, with the recall way it found fastest (benchmarks/recall_choice.py says how)
      recall_settings='{}'
      [[ ${recall_timed:-} ]] && recall_settings=$(python3 -m benchmarks.recall_choice \
        benchmarks/results/recall_kernel_gpu.json) || recall_settings='{}'
      echo "cells: recall_kernel settings $recall_settings" | tee -a "$OUT/gpu.txt"
      timeout "$seconds" python3 -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 \
        --contexts 4096,32768,131072,2048 --methods lminfinite,lminfinite-topk,vanilla --decode-tokens 8 \
        --repeat-budget-s 8 --deadline-s "$(deadline "$seconds" 50)" --recall-settings "$recall_settings" \
        --tag speed_gpu --readme 2>&1 | tee "$OUT/speed_gpu.log"
      rc=${PIPESTATUS[0]}; results+=(benchmarks/results/speed_gpu.{json,md,png}) ;;
    kernels)
      timeout "$seconds" python3 -m benchmarks.window_span --device cuda --window 4096 --heads 32 --head-dim 128 \
        --readme 2>&1 | tee "$OUT/window_span_gpu.log"; rc=${PIPESTATUS[0]}
      results+=(benchmarks/results/window_span_gpu.{json,md}) ;;
    speed)
      timeout "$seconds" python3 -m benchmarks.speed --model random-7b --device cuda --load-in-4bit --window 4096 \
        --max-context 131072 --decode-tokens 8 --deadline-s "$(deadline "$seconds" 120)" \
        --tag speed_gpu --readme 2>&1 | tee "$OUT/speed_gpu.log"
      rc=${PIPESTATUS[0]}; results+=(benchmarks/results/speed_gpu.{json,md,png}) ;;
    recall)
      timeout "$seconds" python3 -m benchmarks.recall_kernel --readme 2>&1 | tee "$OUT/recall_kernel_gpu.log"
      rc=${PIPESTATUS[0]}; results+=(benchmarks/results/recall_kernel_gpu.{json,md}); ((rc)) || recall_timed=1 ;;
    profile)
      timeout "$seconds" python3 -m benchmarks.profile_prefill --model random-7b --device cuda --load-in-4bit \
        --window 4096 --context 4096 2>&1 | tee "$OUT/profile_prefill.log"; rc=${PIPESTATUS[0]} ;;
  esac
  echo "$step: exit $rc after $(( SECONDS - step_started )) s (timeout $seconds s)" | tee -a "$OUT/gpu.txt"
  status=$(( status || rc ))
  cp "${results[@]}" "$OUT"/ 2>/dev/null
done
kill "${prebuilds[@]}" 2>/dev/null  # long done, unless a build hung
exit "$status"
