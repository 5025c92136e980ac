# One image for the API, the workers, `explainq gc` and `explainq demo`.
#
#   CPU (default):  docker build -t explainq .
#   CUDA:           docker build -t explainq:cuda --build-arg FLAVOR=cuda .
#
# The CUDA image is Ubuntu 24.04 (its python3 is 3.12; pyproject's requires-python is >=3.11) with PyPI's Linux
# torch, which is built for CUDA 13.0 and needs an NVIDIA driver >= 580. For an older driver, take a CUDA 12 base
# and the PyTorch index of the same CUDA, after checking that the index serves torch==TORCH_VERSION:
#   --build-arg FLAVOR=cuda --build-arg CUDA_BASE=nvidia/cuda:12.8.1-base-ubuntu24.04 \
#   --build-arg TORCH_INDEX_URL_CUDA=https://download.pytorch.org/whl/cu128
# Both images carry the object-store extras (s3fs, gcsfs: EXPLAINQ_STORE=s3://... or gs://...).
# tests/test_dockerfile.py checks every Python here against requires-python, the torch pin and the extras.
ARG FLAVOR=cpu
ARG CPU_BASE=python:3.11-slim
ARG CUDA_BASE=nvidia/cuda:13.0.0-base-ubuntu24.04

FROM ${CPU_BASE} AS base-cpu
RUN python3 -m venv /opt/venv

FROM ${CUDA_BASE} AS base-cuda
# The base has no Python. A venv keeps pip off the system Python (Ubuntu 24.04 refuses system-wide pip, PEP 668);
# the torch wheels bring their own CUDA libraries, so the small "base" flavour of the CUDA image is enough.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv

FROM base-${FLAVOR}
ARG FLAVOR
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL_CPU=https://download.pytorch.org/whl/cpu
ARG TORCH_INDEX_URL_CUDA=https://pypi.org/simple
ARG EXTRAS=s3,gcs,influence
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 EXPLAINQ_HOME=/data PATH=/opt/venv/bin:$PATH
WORKDIR /app
RUN if [ "$FLAVOR" = cuda ]; then index="$TORCH_INDEX_URL_CUDA"; else index="$TORCH_INDEX_URL_CPU"; fi \
 && pip install "torch==${TORCH_VERSION}" --index-url "$index"
COPY pyproject.toml README.md ./
COPY core ./core
COPY app ./app
COPY workers ./workers
COPY models ./models
COPY explainq ./explainq
RUN pip install ."[${EXTRAS}]"
# EK-FAC's Kronfluence without its declared torchvision, which it never imports (pyproject.toml's "influence")
RUN pip install --no-deps "kronfluence==1.0.1"
# Everything runs as an unprivileged user that owns only the data volume.
RUN groupadd --system --gid 10001 explainq \
 && useradd --system --uid 10001 --gid explainq --home-dir /data --shell /usr/sbin/nologin explainq \
 && mkdir -p /data && chown explainq:explainq /data
USER explainq:explainq
VOLUME ["/data"]
EXPOSE 8000
CMD ["explainq", "api", "--host", "0.0.0.0", "--port", "8000"]
