"""The one settings object: a section per concern, every environment variable declared here.

Environment variables use the prefix ``RAGHEAT_`` and ``__`` between section and field, e.g.
``RAGHEAT_INDEX__KIND=flat`` or ``RAGHEAT_SERVER__PORT=9000``. Command-line flags override them. Below the
environment, a JSON file of sections and fields named by ``RAGHEAT_SETTINGS_FILE`` (``ragheat serve --settings``;
``ragheat tune`` writes one), e.g. ``{"placement": {"memory": "lock"}}``.
Combinations are validated when the object is built, with a sentence naming the setting.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Literal, Mapping

from pydantic import (BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator,
                      model_validator)
from pydantic_settings import BaseSettings, JsonConfigSettingsSource, SettingsConfigDict

from rag.slo import SLO_MS
from rag.stages import QUALITY_LEVELS, RETRIEVER_CHOICES, STAGES

RetrieverName = Literal["dense", "bm25", "graph", "routed"]
IndexKind = Literal["flat", "hnsw", "ivfpq"]


def default_cache_dir() -> Path:
    """ragheat's folder of what is worth keeping between runs: ``$XDG_CACHE_HOME/ragheat`` (``~/.cache/ragheat``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ragheat"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EmbeddingSettings(_Section):
    """The sentence encoder and how it runs."""

    model_dir: Path | None = Field(None, description="BERT sentence-transformers folder; unset = packaged all-MiniLM-L6-v2")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="where ONNX conversions are cached")
    precision: Literal["fp32", "int8"] = Field("int8", description="int8 = 8-bit weights, activations quantised per row: batch-independent (rag/embedding/quantize.py; docs/benchmarks.md)")
    max_seq_length: int = Field(256, ge=8, le=512, description="word pieces per text; longer texts are truncated")
    query_threads: int = Field(1, ge=1, le=64, description="ONNX Runtime threads for one query while other queries "
                                                           "run too")
    query_precision: Literal["same", "fastest", "fp32", "int8", "int8-row"] = Field(
        "fastest", description="the query encoder's precision: same = the passages' (precision); int8-row = int8 with "
        "one activation scale per token on the integer MatMulInteger kernel (batch-independent, for queries only, on "
        "CPUs with VNNI or AMX; rag/embedding/quantize.py); fastest = whichever of fp32, int8 and int8-row runs a query clearly faster than "
        "the passages' precision on this CPU, timed at the first start on it, else the passages'; what each costs in "
        "quality is in docs/benchmarks.md, the quiet case")
    quiet_query_threads: int = Field(0, ge=0, le=64, description="ONNX Runtime threads for a query that finds no other "
                                     "query in the model: idle cores may shorten the quiet case's embedding; 0 = the "
                                     "cores this process may use where they run a lone query clearly faster than "
                                     "query_threads (timed once per CPU, each run after a request's idle gap, and "
                                     "kept), otherwise query_threads; n = n threads; 1 = never more than "
                                     "query_threads")
    bulk_threads: int = Field(0, ge=0, le=256, description="threads for ingestion; 0 = all cores")
    batch_tokens: int = Field(8192, ge=256, description="padded tokens per ingestion batch")
    query_batch_max: int = Field(1, ge=1, le=256, description="queries of concurrent requests that share one model "
                                                              "run (rag/embedding/batcher.py); 1 = no batching, the "
                                                              "default: on the CPU a batch saves no time per query "
                                                              "(padding costs what a run's overhead saves; "
                                                              "docs/benchmarks.md, Micro-batched query embedding)")
    query_batch_wait_ms: float = Field(0.0, ge=0.0, le=50.0, description="how long a batch waits for more queries "
                                       "when requests queued behind the previous run; a request arriving with no "
                                       "run in flight never waits (docs/benchmarks.md, Micro-batched query "
                                       "embedding)")
    query_batch_runs: int = Field(2, ge=1, le=64, description="query model runs in flight at once; queries arriving "
                                                              "while all are busy queue and share the next run")

    @model_validator(mode="after")
    def _check(self) -> "EmbeddingSettings":
        if self.query_batch_max == 1 and self.query_batch_wait_ms > 0:
            raise ValueError(f"embedding.query_batch_wait_ms ({self.query_batch_wait_ms:g}) waits for a batch, but "
                             "embedding.query_batch_max is 1 (no batching): set it above 1, or the wait to 0")
        return self


class RerankSettings(_Section):
    """The late-interaction reranker (rag/rerank, stage ``rerank``): MaxSim of 128-d token vectors, combined with
    the first-stage scores by a trained head, over the top fused candidates. The query's token vectors come from the
    embed stage's own model run; the chunks' are stored in the index generation at ingest (``store_tokens``)."""

    enabled: bool = Field(True, description="rerank the fused candidates (the index needs stored token vectors, "
                                            "store_tokens). On by default: it wins on both held-out sets (SciFact "
                                            "by cross-validation, HotpotQA with the SciFact head) for little CPU per "
                                            "query (docs/benchmarks.md, Reranking)")
    candidates: int = Field(50, ge=1, le=1000, description="fused candidates the reranker rescores")
    head: Path | None = Field(None, description="the head's .npz (`ragheat train-reranker`); unset = the one shipped "
                                                "in rag/rerank/heads/")
    store_tokens: bool = Field(True, description="store each chunk's token vectors at ingest (needed to rerank; part "
                                                 "of the ingest fingerprint). They grow an index several times over "
                                                 "(docs/benchmarks.md, Late-interaction reranker: what it costs); "
                                                 "off only with rerank.enabled off")
    token_dtype: Literal["fp16", "int8", "pq64", "pq32", "pq16"] = Field(
        "int8", description="stored token vectors: int8 with one scale per token (half of fp16's size, the same "
                            "nDCG), fp16, or product codes of 64, 32 or 16 bytes a token (learnt at ingest; for "
                            "corpora whose int8 vectors outgrow memory: docs/scale.md)")


class ChunkingSettings(_Section):
    """How documents become passages."""

    strategy: Literal["tokens", "semantic"] = "tokens"
    window_tokens: int = Field(240, ge=16, le=512, description="token-window size (model word pieces)")
    overlap_tokens: int = Field(16, ge=0, description="tokens shared by consecutive windows")
    semantic_threshold: float = Field(0.45, ge=-1.0, le=1.0,
                                      description="cut where adjacent-sentence cosine falls below this")
    min_tokens: int = Field(48, ge=1, description="semantic chunks are merged up to at least this size")
    max_tokens: int = Field(200, ge=16, le=512, description="semantic chunks never exceed this size")

    @model_validator(mode="after")
    def _check(self) -> "ChunkingSettings":
        if self.overlap_tokens >= self.window_tokens:
            raise ValueError(f"chunking.overlap_tokens ({self.overlap_tokens}) must be smaller than "
                             f"chunking.window_tokens ({self.window_tokens})")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"chunking.min_tokens ({self.min_tokens}) must not exceed chunking.max_tokens "
                             f"({self.max_tokens})")
        return self


class IndexSettings(_Section):
    """FAISS index type and its build/search parameters (search-time ones can change per start)."""

    kind: IndexKind = "hnsw"
    hnsw_m: int = Field(32, ge=4, le=128)
    hnsw_ef_construction: int = Field(200, ge=8)
    hnsw_ef_search: int = Field(128, ge=1)
    ivf_nlist: int = Field(0, ge=0, description="IVF lists; 0 = about 4*sqrt(N), capped by N/39")
    pq_m: int = Field(48, ge=1, description="PQ sub-quantisers; must divide the dimension (384)")
    pq_nbits: int = Field(8, ge=4, le=12)
    ivf_nprobe: int = Field(16, ge=1)
    device: Literal["auto", "cpu", "gpu"] = Field("auto", description="gpu needs faiss-gpu and a visible GPU")


class RetrievalSettings(_Section):
    """Which retrievers run and how their lists are fused."""

    retrievers: list[RetrieverName] = Field(
        default_factory=lambda: ["routed"],
        description="dense, bm25, graph (fused when several), or routed alone (the default): the router picks per "
                    "query its retrievers and whether to rerank; docs/benchmarks.md compares it with fixed sets")
    candidates: int = Field(100, ge=1, le=1000, description="hits each retriever hands to fusion")
    rrf_k: float = Field(5.0, gt=0, description="reciprocal-rank-fusion constant (tuned on SciFact train)")
    dense_weight: float = Field(1.0, ge=0)
    bm25_weight: float = Field(1.2, ge=0, description="BM25 list weight in fusion (dense = 1.0 by default)")
    bm25_k1: float = Field(1.2, gt=0)
    bm25_b: float = Field(0.75, ge=0, le=1)
    stemmer: str = Field("english", description="Snowball language for BM25; empty = no stemming")
    router_model: Path | None = Field(None, description="the router's .npz (`ragheat train-router`); unset = the "
                                                        "model shipped in rag/routing/router.npz")

    @model_validator(mode="after")
    def _check(self) -> "RetrievalSettings":
        if not self.retrievers:
            raise ValueError(f"retrieval.retrievers must name at least one of: {', '.join(RETRIEVER_CHOICES)}")
        if len(set(self.retrievers)) != len(self.retrievers):
            raise ValueError(f"retrieval.retrievers must not repeat a name, got {self.retrievers}")
        if "routed" in self.retrievers and len(self.retrievers) > 1:
            raise ValueError("retrieval.retrievers: routed lets the router choose the retrievers, so it stands alone")
        return self


class GenerationSettings(_Section):
    """Answer composition: extractive (default), or written by a language model with the extractive
    answer as the fallback when the model is down or slow or writes nothing the passages support (docs/vllm.md)."""

    generator: Literal["extractive", "openai", "vllm"] = Field(
        "extractive", description="extractive | openai (any OpenAI-compatible server, e.g. vLLM) | vllm (in-process engine)")
    max_sentences: int = Field(3, ge=1, le=20, description="sentences in an extractive answer")
    passages: int = Field(5, ge=1, le=100, description="top passages the generator reads")
    base_url: str = Field("http://127.0.0.1:8001/v1", description="openai: the server's /v1 URL")
    model: str = Field("", description="openai: served model name (empty = the server's first); vllm: model folder")
    api: Literal["chat", "completions"] = Field("chat", description="openai: /v1/chat/completions or /v1/completions")
    max_tokens: int = Field(
        96, ge=1, le=32768, description="most tokens in a written answer. 96 fits the 1-3 cited sentences "
                                        "constrain_citations allows (SmolLM2-135M's constrained answers: "
                                        "docs/vllm.md) and bounds the decode time of an answer on a CPU")
    prompt_budget_tokens: int = Field(
        600, ge=0, le=131072, description="most tokens of passages in a written answer's prompt (estimated); over it "
                                          "each passage is cut to its most query-relevant sentences, so prefill stays "
                                          "bounded; citations keep their numbers. 0 = no limit")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    constrain_citations: bool = Field(
        True, description="constrain a written answer to sentences each ending in '. [n]' (vLLM structured outputs: "
                          "the model still picks the words and the passage; the support check judges both). Turn off "
                          "for OpenAI-compatible servers without vLLM's `structured_outputs` request field")
    connect_timeout_s: float = Field(0.5, gt=0, le=60, description="openai: connecting to the server")
    first_token_timeout_s: float = Field(2.0, gt=0, le=600,
                                         description="no first token (or no next token) within this: fall back to extractive")
    deadline_s: float = Field(30.0, gt=0, le=3600, description="a written answer taking longer falls back to extractive")
    support_threshold: float = Field(0.5, ge=0.0, le=1.0,
                                     description="a sentence is supported when this share of its terms is in its cited passages")
    unsupported: Literal["drop", "mark"] = Field(
        "drop", description="unsupported sentences of a partly supported written answer: drop = left out of the answer, "
                            "mark = kept with [unsupported] after them; with none supported the extractive answer is "
                            "served (degraded_reason unsupported)")
    vllm_max_model_len: int = Field(4096, ge=64, description="vllm: context length of the in-process engine")
    vllm_max_num_seqs: int = Field(16, ge=1, description="vllm: sequences the in-process engine batches")
    vllm_load_format: str = Field("auto", description="vllm: 'dummy' = random weights (tests, no weight files)")
    vllm_metrics_dir: Path | None = Field(
        None, description="vllm: folder where the engine-core process writes its metrics (its "
                          "PROMETHEUS_MULTIPROC_DIR), served at /metrics; unset = `ragheat serve` makes a fresh one")
    vllm_python: Path | None = Field(
        None, description="interpreter of vLLM's own environment, for the vLLM servers `tune-vllm` and `stack up` "
                          "start; unset = .venv-vllm/bin/python of this checkout")

    @model_validator(mode="after")
    def _check(self) -> "GenerationSettings":
        if self.generator == "vllm" and not self.model:
            raise ValueError("generation.model must name a model folder when generation.generator is vllm")
        if self.generator == "openai" and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"generation.base_url must be an http(s) URL, got {self.base_url!r}")
        return self


class ServerSettings(_Section):
    """HTTP service and its input limits."""

    # A validation error would otherwise print the input it rejects: an API key.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, hide_input_in_errors=True)

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    index_dir: Path = Field(Path("data/index"), description="index folder served by `ragheat serve`")
    max_query_chars: int = Field(2000, ge=1)
    max_body_bytes: int = Field(64 * 1024, ge=1024)
    default_top_k: int = Field(5, ge=1, le=100)
    stage_thread_names: bool = Field(True, description="name the OS thread after the stage it runs (rh:embed, ...) "
                                                       "so kernel probes can attribute scheduler time to stages")
    # -- access (rag/api/access.py) ------------------------------------------------------------------------------
    api_keys: list[SecretStr] = Field(
        default_factory=list, description="API keys accepted as `Authorization: Bearer KEY` or `X-API-Key: KEY`; "
                                          "with neither this nor api_keys_file the API is open, which `ragheat "
                                          "serve` allows only on a loopback host or with insecure_no_api_key. "
                                          "Never logged")
    api_keys_file: Path | None = Field(
        None, description="file of hashed API keys, one `sha256:<64 hex> [name] [priority=high|normal|low]` a line "
                          "(`ragheat keys new`); read at start-up and again on every index reload")
    insecure_no_api_key: bool = Field(
        False, description="let `ragheat serve` listen beyond loopback (host not 127.0.0.0/8, ::1 or localhost) "
                           "without any API key: anyone who reaches the port may query it. Off, such a host without "
                           "keys refuses to start (docs/reliability.md, Who can reach what)")
    rate_limit_per_s: float = Field(0.0, ge=0, le=1e6, description="requests per second each API key (each client "
                                                                  "address without keys) may make to /v1 and /admin; "
                                                                  "0 = no limit")
    rate_limit_burst: int = Field(20, ge=1, le=1_000_000, description="requests a key may make at once before "
                                                                     "rate_limit_per_s applies (the bucket's size)")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serve /metrics on this port (open, on host) "
                                                                       "instead of the API port, where it needs a key "
                                                                       "once keys are set")
    # -- hot swap (rag/index_generations.py) ---------------------------------------------------------------------------
    reload_poll_s: float = Field(2.0, ge=0, le=3600, description="how often the index's `current` link is checked for "
                                                                 "a newer generation, loaded beside the served one and "
                                                                 "swapped in; 0 = only on POST /admin/reload")
    # -- slow and oversized clients (rag/api/connections.py; `ragheat serve`) ------------------------------------
    header_timeout_s: float = Field(10.0, gt=0, le=600, description="a request's line and headers must arrive within "
                                                                    "this, else 408 and the connection is closed")
    body_timeout_s: float = Field(30.0, gt=0, le=3600, description="its body must arrive within this after the "
                                                                   "headers, else 408 and the connection is closed")
    max_header_bytes: int = Field(16384, ge=1024, le=1 << 20, description="request line plus headers; more = 431 and "
                                                                          "the connection is closed")
    worker_min_uptime_s: float = Field(30.0, ge=0, le=3600, description="--workers N: a worker that exits sooner "
                                       "after its start failed to start (all workers stop, with its exit code); one "
                                       "that exits later is restarted and its gauges dropped from the scrape")

    # The keys' strength is checked by rag.api.access.KeyRing at start-up, not here: a pydantic error in this section
    # would print the section's input, keys included, wherever RagheatSettings is validated.
    @field_validator("metrics_port")
    @classmethod
    def _own_port(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value == info.data.get("port"):
            raise ValueError(f"server.metrics_port ({value}) must differ from server.port")
        return value


class TelemetrySettings(_Section):
    """Metrics, traces and their export. The OTLP exporters read the standard OpenTelemetry variables
    (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``..._METRICS_ENDPOINT``,
    ``..._HEADERS``, ``..._TIMEOUT``, ``OTEL_SERVICE_NAME``); they are not repeated here."""

    metrics: bool = Field(True, description="Prometheus metrics at GET /metrics")
    tracing: bool = Field(True, description="a span per request and per stage (trace ids become exemplars)")
    otlp: Literal["auto", "on", "off"] = Field(
        "auto", description="OTLP/HTTP export of spans and metrics; auto = on when an OTEL_EXPORTER_OTLP_*ENDPOINT is set")
    otlp_metrics_interval_s: float = Field(10.0, gt=0, description="how often metrics are pushed over OTLP")
    capture_content: bool = Field(False, description="record query and passage text in spans")
    trace_sample_ratio: float = Field(0.1, ge=0.0, le=1.0,
                                      description="share of requests traced (head sampling); exemplars come from traced ones")
    qps_window_s: float = Field(10.0, gt=0, description="sliding window for the request rate behind qps_bucket")
    qps_edges: list[float] = Field(default_factory=lambda: [1.0, 10.0, 50.0, 200.0],
                                   description="qps_bucket edges (requests/s); labels 0-1, 1-10, ..., 200+")
    span_queue_size: int = Field(2048, ge=16, description="finished spans waiting for export; beyond it they are dropped and counted")
    export_batch_size: int = Field(512, ge=1, description="spans per OTLP request (sent sooner after 2 s)")
    export_timeout_s: float = Field(5.0, gt=0, description="one OTLP export attempt, retries included")
    service_name: str = Field("ragheat", min_length=1)
    vllm_plugin: bool = Field(True, description="ragheat's hooks inside vLLM's processes (per-step KV-cache and token "
                                                "metrics); false leaves vLLM untouched. Read by the plugin itself")

    @model_validator(mode="after")
    def _check(self) -> "TelemetrySettings":
        edges = self.qps_edges
        if (not edges or not all(math.isfinite(e) for e in edges) or edges[0] <= 0
                or any(b <= a for a, b in zip(edges, edges[1:]))):
            raise ValueError(f"telemetry.qps_edges must be positive and strictly increasing, got {edges}")
        if self.export_batch_size > self.span_queue_size:
            raise ValueError("telemetry.export_batch_size must not exceed telemetry.span_queue_size")
        return self


def telemetry_from_environment(environ: Mapping[str, str]) -> TelemetrySettings:
    """``TelemetrySettings`` from the ``RAGHEAT_TELEMETRY__<FIELD>`` variables of ``environ`` alone (a service that
    imports only the observing library has no other section to configure). Lists are JSON (``[1, 10, 50]``)."""
    prefix = "RAGHEAT_TELEMETRY__"
    values = {}
    for key, value in environ.items():
        if key.startswith(prefix):
            field = key[len(prefix):].lower()
            values[field] = json.loads(value) if value.lstrip().startswith("[") else value
    try:
        return TelemetrySettings(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{prefix}{'.'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"telemetry settings from the environment are invalid: {problems}") from None


class GraphSettings(_Section):
    """The knowledge graph (rag/graph): built at ingest from document titles and their mentions, stored in the
    embedded FalkorDB (a child process on a unix socket, its file inside the index generation) or a Neo4j server,
    searched by the ``graph`` retriever. Build-time fields are part of the ingest fingerprint: changing one
    rebuilds the graph (only the graph: chunks and embeddings are reused)."""

    enabled: bool = Field(True, description="build the graph at ingest, and serve the graph retriever when the "
                                            "index has one")
    backend: Literal["falkordb", "neo4j"] = Field(
        "falkordb", description="falkordb = embedded store inside the index generation; neo4j = the server at uri")
    uri: str = Field("bolt://127.0.0.1:7687", pattern=r"^(bolt|neo4j)(\+s|\+ssc)?://",
                     description="neo4j: Bolt URI of the server")
    user: str = Field("neo4j", min_length=1)
    password: SecretStr = Field(SecretStr(""), description="never logged or printed")
    database: str = Field("neo4j", min_length=1)
    hops: int = Field(2, ge=1, le=2, description="co-occurrence hops expanded from the query's entities")
    top_n: int = Field(10, ge=1, le=1000, description="neighbours kept per entity per hop, by edge weight")
    decay: float = Field(0.5, gt=0, le=1, description="score multiplier per hop")
    weight: float = Field(1.5, ge=0, description="graph list weight in fusion (dense 1.0, bm25 1.2)")
    execution: Literal["cypher", "adjacency"] = Field(
        "cypher", description="cypher = one parameterised 2-hop query per request in the store; adjacency = the "
                              "pruned edges pulled from the store at warm-up and walked in process")
    timeout_ms: int = Field(1000, ge=10, le=60_000, description="one graph query; longer = the store is unavailable")
    max_alias_df: float = Field(0.01, gt=0, le=1, description="aliases found in more than this share of chunks are "
                                                             "words, not names: not used for mentions")
    min_alias_chars: int = Field(3, ge=1, le=64, description="shorter aliases are not used")
    comma_aliases: Literal["short", "all", "none"] = Field(
        "short", description="'Davenport, Florida' -> 'davenport': short = only for short 'Name, Qualifier' titles")
    link_by_embedding: bool = Field(False, description="also seed the nearest entity titles by embedding (embeds "
                                                       "every title at ingest; it lowers fused nDCG)")
    embedding_seeds: int = Field(3, ge=1, le=100, description="link_by_embedding: nearest titles added as seeds")
    embedding_min_similarity: float = Field(0.5, ge=-1, le=1, description="link_by_embedding: least cosine")
    embedding_seed_weight: float = Field(0.3, gt=0, le=1, description="link_by_embedding: seed weight per cosine")
    store_threads: int = Field(2, ge=1, le=64, description="falkordb: the embedded server's query threads")
    load_batch: int = Field(5000, ge=1, le=1_000_000, description="rows per UNWIND statement at ingest")


class VectorStoreSettings(_Section):
    """Where the dense and BM25 retrievers search: the index generation's own files (FAISS and bm25s, in process: the
    default) or a Milvus server (rag/index/milvus.py), where ``ragheat ingest`` publishes one collection per index
    generation beside the served one. The generation's own files are written either way. Changing the backend or the
    server re-ingests from the same chunks and embeddings (nothing is embedded again)."""

    backend: Literal["local", "milvus"] = Field("local", description="local = FAISS and bm25s over the generation's "
                                                                     "files; milvus = the collection at uri")
    uri: str = Field("http://127.0.0.1:19530", pattern=r"^(https?|tcp)://", description="milvus: the server")
    token: SecretStr = Field(SecretStr(""), description="milvus: user:password or an API key; never logged or printed")
    collection_prefix: str = Field("ragheat", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$",
                                   description="milvus: collections are named PREFIX_<index>_<generation>")
    timeout_ms: int = Field(2000, ge=10, le=600_000, description="milvus: one search or look-up; longer = the "
                                                                 "server is unavailable")
    load_timeout_s: float = Field(600.0, gt=0, le=86_400, description="milvus: one step of loading a collection "
                                                                      "(create, an insert, flush, load, drop)")
    load_batch: int = Field(2000, ge=1, le=100_000, description="milvus: passages per insert at ingest")
    fallback: Literal["files", "none"] = Field(
        "files", description="milvus: what searches while the server is down: files = the generation's own FAISS and "
                             "BM25 indexes, held in this process's memory (the same rankings); none = not loaded (the "
                             "memory they take moves to Milvus), so the dense and BM25 stages are skipped while it is "
                             "down and the answer, from what else retrieved, says it is degraded")


class CacheSettings(_Section):
    """The semantic answer cache (rag/cache, stage ``cache_lookup``): an answer given before is served again for a
    query whose embedding is close enough, with the same top_k, retrievers and rerank flag, from the same index
    generation (the cache lives in the generation's pipeline: a swap starts an empty one). Bounded by entries and
    bytes (least recently used out first) and by age."""

    enabled: bool = Field(False, description="look answers up in the semantic cache after embedding, before "
                                             "retrieving. Off by default: a hit serves the answer given to another "
                                             "wording of the question (cosine >= threshold), every query is then "
                                             "embedded even when no dense retrieval runs, and it pays only where "
                                             "questions repeat (docs/benchmarks.md, Semantic answer cache)")
    threshold: float = Field(0.97, ge=0.5, le=1.0, description="least cosine between the query's embedding and a "
                                                               "stored one for a hit (1.0 = the same text, up to case "
                                                               "and spacing)")
    max_entries: int = Field(4096, ge=1, le=1_000_000, description="answers held; the lookup is one matrix-vector "
                                                                   "product over all of them")
    max_bytes: int = Field(64 * 2**20, ge=4096, description="estimated bytes of the answers held (the passages "
                                                            "they cite are the index's own, not counted)")
    ttl_s: float = Field(600.0, gt=0, le=7 * 86400, description="an answer older than this is not served again")


class QualitySettings(_Section):
    """Answer quality without labels (rag/quality): signals on every request (best passage similarity, retriever
    agreement, the reranker's scores, a written answer's support) and the verdict the quality SLO counts."""

    enabled: bool = Field(True, description="measure each answer's quality signals and verdict (a few microseconds "
                                            "per request: docs/quality.md)")
    calibration: Path | None = Field(None, description="calibration file (`ragheat calibrate-quality`): the best "
                                                       "similarity's threshold and the training queries' reference "
                                                       "quantiles; unset = the one shipped in rag/quality/, measured "
                                                       "on the repository's training sets with the shipped encoder")
    min_similarity: float | None = Field(None, ge=-1.0, le=1.0, description="best similarity below which an answer "
                                                                            "has no good passage; unset = the "
                                                                            "calibration's")
    min_support: float = Field(0.5, ge=0.0, le=1.0, description="least share of a written answer's sentences the "
                                                                "support check must accept for it to count as "
                                                                "supported")
    judge_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of answers whose first passage the language "
                                                               "model judges relevant or not, off the request path "
                                                               "(needs a model). Off by default: the installed "
                                                               "model's agreement with human labels does not earn it "
                                                               "(docs/quality.md)")
    judge_queue: int = Field(16, ge=1, le=10_000, description="sampled pairs waiting for the judge; more are dropped "
                                                              "(counted), never waited for")


class AdmissionSettings(_Section):
    """Admission control and deadlines (rag/api/admission.py): a bounded number of requests in flight and a bounded
    queue; a request that could not finish within its deadline is refused at once (503 + Retry-After)."""

    enabled: bool = Field(True, description="bound the requests in flight and shed what cannot meet its deadline")
    max_in_flight: int = Field(4, ge=1, le=256, description="queries running on worker threads at once (per "
                                                            "process); more only contend for the cores and the GIL")
    max_queue: int = Field(128, ge=0, le=100_000, description="queries waiting for a slot; one more is refused "
                                                              "(queue_full) whatever its deadline")
    deadline_ms: float = Field(SLO_MS, gt=0, le=600_000, description="a query's deadline from its arrival when it "
                                                                     "names none (default: the SLO, rag/slo.py)")
    max_timeout_ms: int = Field(10_000, ge=1, le=600_000, description="the largest deadline a request may ask for "
                                                                        "(body timeout_ms or X-Request-Timeout-Ms); "
                                                                        "more is a 422")
    degrade: bool = Field(True, description="skip optional stages (rerank, retrieve_graph, hyde, the language model) "
                                            "whose recent time the remaining budget cannot hold; the answer lists them "
                                            "in skipped_stages and is degraded")
    headroom: float = Field(0.15, ge=0, lt=1, description="share of a deadline kept free when predicting: what the "
                                                          "service cannot see (the kernel's accept queue, parsing, the "
                                                          "way back to the client) must fit in it")
    ewma_alpha: float = Field(0.2, gt=0, le=1, description="weight of the newest request in the recent service and "
                                                           "stage times the predictions use")
    estimate_ttl_s: float = Field(5.0, gt=0, le=3600, description="a stage skipped for its recent time runs again "
                                                                  "once that estimate is this old, and that run's time "
                                                                  "replaces it, so a stage that got faster is not "
                                                                  "skipped for ever")
    worker_nice: int = Field(10, ge=0, le=19, description="nice value of the threads that run queries (0 = the event "
                                                          "loop's): past the knee the event loop, which admits and "
                                                          "refuses, gets the cores first (rag/api/worker_priority.py)")

    @model_validator(mode="after")
    def _check(self) -> "AdmissionSettings":
        if self.deadline_ms > self.max_timeout_ms:
            raise ValueError(f"admission.deadline_ms ({self.deadline_ms:g}) must not exceed admission.max_timeout_ms "
                             f"({self.max_timeout_ms:g})")
        return self


class SteeringSettings(_Section):
    """Steering under load (rag/steering, rag/api/steering.py): a controller steps the quality ladder down (cheaper
    answers: no rerank, BM25 alone, ...) before admission control has to refuse anyone, and back up when the load
    falls. Each answer says the rung that served it (``quality_level``)."""

    enabled: bool = Field(True, description="run the controller (off: every query is served at the top rung, and "
                                            "admission control alone refuses what it cannot answer in time)")
    floor: Literal[QUALITY_LEVELS] = Field("bm25_only", description="the lowest rung the controller may step down "
                                                                    "to; below it, admission control refuses")
    ladder: Path | None = Field(None, description="measured cost per rung (`ragheat measure-ladder`); unset = the one "
                                                  "shipped in rag/steering/ladder.json")
    interval_s: float = Field(1.0, gt=0, le=60, description="how often the controller reads the load")
    hold_s: float = Field(5.0, ge=0, le=600, description="least time without pressure before a step up (doubled "
                                                         "after a step up that did not hold, while the load stays "
                                                         "at the rate it failed at)")
    window_s: float = Field(5.0, gt=0, le=600, description="the arrival rate is averaged over this")
    down_at: float = Field(1.2, gt=0, le=2, description="step down when the arrivals would take this share of the "
                                                        "capacity at the current rung (the CPU the process reaches "
                                                        "when saturated at that rung; every core until it has been)")
    settle_at: float = Field(0.9, gt=0, le=2, description="a step down goes to the best rung whose demand is under "
                                                          "this share of the capacity")
    up_at: float = Field(1.05, gt=0, le=2, description="step up to the best rung whose demand would be under this "
                                                       "share of the capacity (and that did not come under pressure "
                                                       "at this load lately)")
    pressure_share: float = Field(0.5, gt=0, le=1, description="step down when a query arriving now is predicted to "
                                                               "finish after this share of its deadline in two "
                                                               "readings running, the second not sooner")

    @model_validator(mode="after")
    def _check(self) -> "SteeringSettings":
        if not (self.settle_at < self.down_at and self.up_at < self.down_at):
            raise ValueError(f"steering needs settle_at and up_at under down_at, got settle_at {self.settle_at:g}, "
                             f"up_at {self.up_at:g}, down_at {self.down_at:g}")
        return self


class HydeSettings(_Section):
    """HyDE (stage ``hyde``): the language model writes a short hypothetical passage for the question; its embedding
    drives dense retrieval beside the question's own (fused). Skipped, and said so, when the model is slow or down."""

    enabled: bool = Field(False, description="write a hypothetical passage for dense retrieval (needs "
                                             "generation.generator openai or vllm); off by default: see docs/vllm.md "
                                             "for where it wins and what it costs")
    max_tokens: int = Field(64, ge=8, le=1024, description="most tokens in the hypothetical passage")
    deadline_ms: float = Field(2500.0, gt=0, le=600_000, description="the passage not written within this: the stage "
                                                                      "is skipped (and said so), retrieval goes on "
                                                                      "with the question's own embedding")
    weight: float = Field(1.0, ge=0.0, le=10.0, description="the passage's dense run in the RRF that fuses it with "
                                                            "the question's own dense run (weight 1)")


class PlacementSettings(_Section):
    """Where the service's work runs and how its index memory is held (rag/placement.py); ``ragheat tune`` measures
    each knob before it keeps it (docs/tuning.md)."""

    cpus: str = Field("", description="the cores the service's threads run on, as taskset -c lists them (0-3,6); "
                                      "empty = every core the process may use. A model server on the other cores "
                                      "then never shares these")
    math_threads: int = Field(0, ge=0, le=256, description="FAISS's OpenMP threads; 0 = FAISS's default (one per core)")
    memory: Literal["default", "lock", "hugepages"] = Field(
        "default", description="default = the token vectors are read into the page cache at warm-up; lock = every "
        "page mapped once a generation is warm (dense index, token vectors, models) is locked in memory (mlockall: "
        "needs CAP_IPC_LOCK or ulimit -l); hugepages = the token vectors are copied into memory advised for "
        "transparent huge pages")

    @field_validator("cpus")
    @classmethod
    def _cpu_list(cls, value: str) -> str:
        if value.strip():
            from rag.placement import format_cpu_list, parse_cpu_list

            return format_cpu_list(parse_cpu_list(value))
        return ""


class ProbeSettings(_Section):
    """eBPF kernel probes (``ragheat probes``, or in-process with ``ragheat serve --probes``)."""

    scheduler: bool = Field(True, description="run-queue latency and off-CPU time per stage")
    syscalls: bool = Field(False, description="system-call latency per stage and family (costs more per event)")
    tcp_retransmits: bool = Field(True, description="count TCP retransmissions")
    port: int = Field(9465, ge=0, le=65535, description="port of the probes' own /metrics")


class FaultSettings(_Section):
    """Fault injection for drills and alert tests; off by default."""

    delay_stage: str | None = Field(None, description="pipeline stage to slow down (one of rag.stages.STAGES)")
    delay_ms: float = Field(0.0, ge=0, le=60_000, description="extra time spent in delay_stage per request")

    @model_validator(mode="after")
    def _check(self) -> "FaultSettings":
        if self.delay_stage is not None and self.delay_stage not in STAGES:
            raise ValueError(f"faults.delay_stage must be one of {', '.join(STAGES)}, got {self.delay_stage!r}")
        return self


SETTINGS_FILE_ENV = "RAGHEAT_SETTINGS_FILE"
"""The environment variable naming a JSON settings file (below the environment, above the defaults)."""


class _SettingsFile(JsonConfigSettingsSource):
    """The settings file, or a clear error naming it when it is missing or not a JSON object."""

    def __init__(self, settings_cls, path: Path) -> None:
        if not path.is_file():
            raise ValueError(f"{SETTINGS_FILE_ENV}={path}: no such file")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{SETTINGS_FILE_ENV}={path}: not readable JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{SETTINGS_FILE_ENV}={path}: a JSON object of sections is needed")
        super().__init__(settings_cls, json_file=path)


class RagheatSettings(BaseSettings):
    """All of ragheat's configuration, one section per concern."""

    model_config = SettingsConfigDict(env_prefix="RAGHEAT_", env_nested_delimiter="__", extra="forbid")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        """Flags, then the environment, then the JSON file ``RAGHEAT_SETTINGS_FILE`` names (``ragheat tune`` writes
        one; its sections and fields as here), then the defaults."""
        sources = [init_settings, env_settings]
        if path := os.environ.get(SETTINGS_FILE_ENV):
            sources.append(_SettingsFile(settings_cls, Path(path)))
        return tuple(sources)

    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    chunking: ChunkingSettings = Field(default_factory=ChunkingSettings)
    index: IndexSettings = Field(default_factory=IndexSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    rerank: RerankSettings = Field(default_factory=RerankSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    steering: SteeringSettings = Field(default_factory=SteeringSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)
    hyde: HydeSettings = Field(default_factory=HydeSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    graph: GraphSettings = Field(default_factory=GraphSettings)
    vector_store: VectorStoreSettings = Field(default_factory=VectorStoreSettings)
    probes: ProbeSettings = Field(default_factory=ProbeSettings)
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    faults: FaultSettings = Field(default_factory=FaultSettings)

    @model_validator(mode="after")
    def _check(self) -> "RagheatSettings":
        if self.chunking.max_tokens > self.embedding.max_seq_length - 2:
            raise ValueError(f"chunking.max_tokens ({self.chunking.max_tokens}) must leave room for [CLS]/[SEP] "
                             f"within embedding.max_seq_length ({self.embedding.max_seq_length})")
        if self.chunking.window_tokens > self.embedding.max_seq_length - 2:
            raise ValueError(f"chunking.window_tokens ({self.chunking.window_tokens}) must leave room for "
                             f"[CLS]/[SEP] within embedding.max_seq_length ({self.embedding.max_seq_length})")
        if self.rerank.enabled and not self.rerank.store_tokens:
            raise ValueError("rerank.enabled (the default) needs the token vectors that rerank.store_tokens keeps at "
                             "ingest: turn rerank.store_tokens on (and re-ingest), or rerank.enabled off as well "
                             "(RAGHEAT_RERANK__ENABLED=false)")
        if self.rerank.enabled and self.rerank.candidates > self.retrieval.candidates:
            raise ValueError(f"rerank.candidates ({self.rerank.candidates}) must not exceed retrieval.candidates "
                             f"({self.retrieval.candidates}): fusion cannot hand over more than each retriever found")
        return self
