"""What an ingest costs, by a real ingest: the first COST_DOCS SciFact abstracts chunked, embedded and indexed
(FAISS and BM25) by this checkout, with the CPU seconds of this process's threads counted (a CPU hog beside the
suite steals wall time and barely moves CPU seconds). Serial: the ratio compares two CPU measurements of this
process, both alone on the machine.
"""

from __future__ import annotations

import json
import random
import resource

import pytest

from rag.index.store import load_index
from rag.ingest.pipeline import ingest, passage_text
from scifact_full import measured_settings

COST_DOCS = 250
# A ceiling per abstract, in CPU seconds, with room for a slower CPU; the ratio below is what catches wasted work.
MAX_INGEST_CPU_S_PER_DOC = 0.35
# Ingest = chunking + embedding + FAISS + BM25: no more than this times the CPU of embedding its chunks (the
# ingest batches chunks of similar length, the sample pads more, so the ratio is below 1 when nothing is wasted).
MAX_INGEST_OVER_EMBED = 1.5

pytestmark = [pytest.mark.slow, pytest.mark.serial]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture(scope="module")
def measured_ingest(scifact_dir, settings, embedder, tmp_path_factory):
    corpus = tmp_path_factory.mktemp("ingest-cost")
    with open(scifact_dir / "corpus.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for _, line in zip(range(COST_DOCS), fh)]
    (corpus / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    built_with = measured_settings(settings)
    before = cpu_seconds()
    report = ingest(str(corpus), corpus / "index", built_with, embedder=embedder)
    return corpus / "index", report.manifest, cpu_seconds() - before, built_with


def test_ingest_cpu_cost(measured_ingest, embedder):
    index, manifest, ingest_cpu_s, built_with = measured_ingest
    chunks = load_index(index, built_with.index).chunks
    assert manifest["counts"]["documents"] == COST_DOCS
    assert len(chunks) == manifest["counts"]["chunks"] > COST_DOCS
    assert ingest_cpu_s <= MAX_INGEST_CPU_S_PER_DOC * COST_DOCS, ingest_cpu_s
    # The same embedder on a random fifth of the chunks: its CPU per chunk, scaled up, is what embedding alone
    # costs; a pipeline that embeds twice, or chunks or indexes in quadratic time, goes over the ratio.
    sample = random.Random(3).sample(chunks, len(chunks) // 5)
    before = cpu_seconds()
    embedder.embed_many([passage_text(c) for c in sample])
    embed_cpu_s = (cpu_seconds() - before) * len(chunks) / len(sample)
    assert ingest_cpu_s <= MAX_INGEST_OVER_EMBED * embed_cpu_s, (ingest_cpu_s, embed_cpu_s)
