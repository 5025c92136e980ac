# CPU by default. For CUDA: docker build --build-arg BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 \
#   --build-arg TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu124" .
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 EXPLAINQ_HOME=/data
RUN if ! command -v python3 >/dev/null; then apt-get update && apt-get install -y --no-install-recommends \
      python3 python3-pip python3-venv && rm -rf /var/lib/apt/lists/*; fi \
 && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
RUN pip install ${TORCH_SPEC}
COPY pyproject.toml README.md ./
COPY core ./core
COPY app ./app
COPY workers ./workers
COPY models ./models
COPY explainq ./explainq
RUN pip install .
# Everything runs as an unprivileged user that owns only the data volume.
RUN groupadd --system --gid 10001 explainq \
 && useradd --system --uid 10001 --gid explainq --home-dir /data --shell /usr/sbin/nologin explainq \
 && mkdir -p /data && chown explainq:explainq /data
USER explainq:explainq
VOLUME ["/data"]
EXPOSE 8000
CMD ["explainq", "api", "--host", "0.0.0.0", "--port", "8000"]
