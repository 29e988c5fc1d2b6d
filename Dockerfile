# syntax=docker/dockerfile:1
# musicrel service image. CPU by default:
#   docker build -t musicrel .
# CUDA (see the `gpu` profile in docker-compose.yml):
#   docker build -t musicrel:gpu --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# Torch is installed first, pinned and from its own index, so the project's looser `torch>=` never pulls a
# second (CUDA) build into a CPU image. Keep TORCH_SPEC in step with the Makefile's.
ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# CUDA bases ship no Python; python:*-slim does. A venv either way (Debian/Ubuntu system Python refuses pip).
RUN set -eux; \
    if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update; \
      apt-get install -y --no-install-recommends python3 python3-venv; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv "$VIRTUAL_ENV"; \
    pip install --upgrade pip

RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY musicrel ./musicrel
COPY server ./server
COPY training ./training
RUN pip install ".[serve]" && python -c "import musicrel, server.app"

# The shipped models (WORKDIR /app: the accompaniment, infill and instruments models' defaults,
# checkpoints/accompany, infill and multi, are relative to it); docker-compose.yml also mounts them read-only
# so a retrained one needs no rebuild.
COPY checkpoints/default /app/checkpoints/default
COPY checkpoints/accompany /app/checkpoints/accompany
COPY checkpoints/infill /app/checkpoints/infill
COPY checkpoints/multi /app/checkpoints/multi

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin musicrel
USER musicrel

EXPOSE 8000
# /readyz is 503 until the model is loaded and warmed up, and again while draining after SIGTERM.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
STOPSIGNAL SIGTERM
CMD ["musicrel", "serve", "--checkpoint", "/app/checkpoints/default", "--host", "0.0.0.0", "--port", "8000"]
