#!/usr/bin/env bash
# Here (a machine with the package registries), before a device call: the wheels scripts/gpu_check.sh installs
# on the GPU machine, which has PyTorch but can fetch nothing. Its image has transformers 5.17, no bitsandbytes,
# no Gradio; the project pins transformers 5.23.0, bitsandbytes 0.50.2 and gradio 6.31.0. A device call carries
# 64 MiB with the tree, so two wheels are slimmed: bitsandbytes keeps only its CUDA 13 and CPU kernels (43 MB
# -> 7 MB), and Gradio drops what only a browser page or a demo uses (WebAssembly, fonts, the SSR node server,
# sample media: 31 MB -> about 8 MB); the tests drive the app through its API, which needs none of them.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 -d .whl "$@"
}
download transformers==5.23.0 bitsandbytes==0.50.2
# The app (python app.py, tests/test_app_cuda.py): Gradio, ingest's chunker and the sources' keyword ranking
# (bm25s), with what they need that the GPU image lacks (its own package list: .library/device/KINDS.md). PDFs are
# not read there (no PyMuPDF).
download bm25s==0.3.16
download gradio==6.31.0 gradio-client==2.7.2 hf-gradio==0.4.1 fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 \
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5 python-multipart==0.0.34 \
  orjson==3.13.0 groovy==0.1.2 safehttpx==0.1.7 semantic-version==2.10.0 tomlkit==0.14.0 brotli==1.2.1 \
  pydub==0.25.1 websockets==17.4 httpx2==2.16.2 httpcore2==2.16.2 sniffio==1.3.1 truststore==0.10.5 distro==1.9.0 \
  pytz==2026.6 tzdata==2026.6 langchain-text-splitters==1.1.3 langchain-core==1.7.2 langchain-protocol==0.0.20 \
  langsmith==0.15.0 jsonpatch==1.47 jsonpointer==3.12 tenacity==9.2.1 requests-toolbelt==1.0.0 \
  uuid-utils==0.19.0 zstandard==0.25.0 opentelemetry-api==1.45.2
python3 - <<'PY'
import base64, hashlib, pathlib, zipfile

def slim(pattern, keep):
    """Rewrite the wheel without the files ``keep`` rejects, with a RECORD that matches what is left."""
    wheel = next(pathlib.Path(".whl").glob(pattern))
    out = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = [n for n in src.namelist() if keep(n)]
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        lines = []
        for name in names:
            if name == record:
                continue
            data = src.read(name)
            dst.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{name},sha256={digest},{len(data)}")
        dst.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
    out.replace(wheel)

slim("bitsandbytes-*.whl", lambda n: not (n.endswith(".so") and "libbitsandbytes_" in n)
     or any(tag in n for tag in ("_cuda130", "_cuda132", "_cpu")))
BROWSER_ONLY = (".wasm", ".woff", ".woff2", ".ttf", ".map")
slim("gradio-6*.whl", lambda n: not n.endswith(BROWSER_ONLY) and not n.startswith(
    ("gradio/templates/node/", "gradio/media_assets/", "gradio/test_data/", "gradio/_frontend_code/")))
PY
du -ch .whl/* | tail -1
