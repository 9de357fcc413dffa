"""The ingest's part of reranking: which head and dtype project the chunks' token vectors (``rerank`` settings,
when the section exists; otherwise the shipped head in fp16), collected from the embedding run itself."""

from __future__ import annotations

from pathlib import Path

from rag.errors import ConfigurationError
from rag.rerank.head import DEFAULT_HEAD, RerankHead
from rag.rerank.store import TokenVectorWriter


def token_writer(settings) -> TokenVectorWriter | None:
    """A writer for this ingest's token vectors, or None when ``rerank.store_tokens`` is off. A head named in
    ``rerank.head`` must exist (``ConfigurationError``); the shipped head is used otherwise."""
    section = getattr(settings, "rerank", None)
    if section is not None and not section.store_tokens:
        return None
    path = Path(section.head) if section is not None and section.head else DEFAULT_HEAD
    if not path.is_file():
        raise ConfigurationError(f"rerank.head: {path} does not exist (train one with `ragheat train-reranker`, or "
                                 f"turn rerank.store_tokens off)")
    dtype = section.token_dtype if section is not None else "fp16"
    return TokenVectorWriter(RerankHead.load(path), dtype)


def token_config(writer: TokenVectorWriter | None) -> dict | None:
    """The fingerprint's part: another head or dtype re-embeds (the vectors are written in the same run)."""
    return None if writer is None else {"dtype": writer.dtype, "projection_sha256": writer.head.projection_sha256}
