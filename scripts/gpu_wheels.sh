#!/usr/bin/env bash
# Here (a machine with the package registries), before a device call: the wheels scripts/gpu_check.sh installs
# on the GPU machine, which has PyTorch but can fetch nothing. Its image has transformers 5.17, no bitsandbytes;
# the project pins transformers 5.23.0 and bitsandbytes 0.50.2. bitsandbytes ships kernels for every CUDA
# version (43 MB); only CUDA 13's and the CPU's are kept, so everything fits the 64 MiB a device call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl transformers==5.23.0 bitsandbytes==0.50.2
python3 - <<'PY'
import base64, hashlib, pathlib, zipfile
wheel = next(pathlib.Path(".whl").glob("bitsandbytes-*.whl"))
keep = lambda name: not (name.endswith(".so") and "libbitsandbytes_" in name) or any(
    tag in name for tag in ("_cuda130", "_cuda132", "_cpu"))
slim = wheel.with_suffix(".slim")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    names = [n for n in src.namelist() if keep(n)]
    record = next(n for n in names if n.endswith("RECORD"))
    lines = []
    for name in names:
        if name == record:
            continue
        data = src.read(name)
        dst.writestr(name, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    dst.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
slim.replace(wheel)
PY
du -ch .whl/* | tail -1
