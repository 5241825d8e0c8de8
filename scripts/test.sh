#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver) >/dev/null \
    || echo "warning: chromium could not be installed; browser tests will be skipped" >&2
fi
python -m pip install -q -r requirements-dev.txt
python -m pip install -q --no-deps -e .
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
exec python -m pytest "$@"
