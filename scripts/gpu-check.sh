#!/usr/bin/env bash
# Issue 43's device check (musicrel/bench/gpucheck.py), from the repository root:
#   bash scripts/gpu-check.sh wheels        here, before the lease: gpu_wheels/ (git-ignored), the wheels of
#                                           what the service needs that the GPU image lacks
#   bash scripts/gpu-check.sh OUT [ARGS]    there, on the bare GPU machine: installs gpu_wheels/ into
#                                           /tmp/site, then `python3 -m musicrel.bench gpu-check OUT ARGS`
# docs/BENCHMARKS.md gives the device tool's exact command.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=gpu_wheels

if [ "${1:-}" = "wheels" ]; then
    PY=.venv/bin/python
    [ -x "$PY" ] || PY=python3
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    # training/pack.py's closure and download, for the service's requirements instead of training's.
    "$PY" - "$WHEELS" <<'PYEOF'
import sys
from pathlib import Path

from training.pack import closure, pip_download, slim_wheels, wheel_specs

# The GPU image's packages the service's requirements meet (docs of the device tool: its package list);
# typing-extensions is packed all the same: pydantic needs a recent one.
IMAGE_HAS = ("torch", "numpy", "safetensors", "tqdm", "anyio", "h11", "httpcore", "httpx", "idna", "certifi",
             "prometheus-client", "click", "pyyaml", "uvloop", "psutil", "six", "setuptools", "packaging",
             "annotated-doc")
dest = Path(sys.argv[1])
need = closure(["musicrel[serve]", "httpx"], stop=IMAGE_HAS)
missing = sorted((need - closure(IMAGE_HAS, strict=False) - {"musicrel"}) | {"typing-extensions"})
pip_download(wheel_specs(missing), dest)
slim_wheels(dest)
size = sum(p.stat().st_size for p in dest.glob("*.whl"))
print(f"{dest}: {len(missing)} wheels, {size / 2**20:.1f} MiB: {', '.join(missing)}")
PYEOF
    exit 0
fi

if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "usage: bash scripts/gpu-check.sh wheels | OUT [gpucheck arguments]" >&2
    exit 2
fi
PY=${PYTHON:-python3}  # the image's python3 holds torch; PYTHON: another (the CPU tests)
# Only where the service's packages are missing (the bare image): a checkout's own venv keeps its own.
if ! "$PY" -c "import fastapi, uvicorn, pydantic_settings, python_multipart, pretty_midi" 2>/dev/null \
    && compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
exec "$PY" -m musicrel.bench gpu-check "$@"
