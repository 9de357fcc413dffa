"""A generation's chunks read where they lie (rag/index/chunks.py): a table over the mapped file, checked whole
against the SHA-256 its manifest recorded, with no Python object per chunk."""

from __future__ import annotations

import gc
import json

import pytest

from rag.errors import IndexLoadError
from rag.index.chunks import CHUNKS, DIGEST_KEY, ChunkTable, file_sha256, read_chunks, write_chunks
from rag.index.store import IndexWriter, read_manifest, resolve_generation
from rag.types import Chunk


def chunks(n: int) -> list[Chunk]:
    return [Chunk(i, f"doc-{i // 3}", f"Title {i // 3}", f"Passage {i}: naïve café text, \"quoted\".", 10 * i,
                  10 * i + 9) for i in range(n)]


def test_the_table_reads_back_what_was_written(tmp_path):
    written = chunks(50)
    write_chunks(tmp_path / CHUNKS, written)
    table = read_chunks(tmp_path / CHUNKS)
    assert len(table) == 50 and list(table) == written
    assert table[-1] == written[-1] and table[7:10] == written[7:10]
    with pytest.raises(IndexError):
        table[50]


def test_an_empty_file_and_a_last_line_without_newline(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert len(read_chunks(tmp_path / "empty.jsonl")) == 0
    write_chunks(tmp_path / CHUNKS, chunks(3))
    (tmp_path / CHUNKS).write_bytes((tmp_path / CHUNKS).read_bytes().rstrip(b"\n"))
    assert [c.text for c in read_chunks(tmp_path / CHUNKS)] == [c.text for c in chunks(3)]


def test_loading_makes_no_object_per_chunk(tmp_path):
    write_chunks(tmp_path / CHUNKS, chunks(20_000))
    digest = file_sha256(tmp_path / CHUNKS)
    gc.collect()
    before = len(gc.get_objects())
    table = read_chunks(tmp_path / CHUNKS, digest)
    assert len(table) == 20_000
    assert len(gc.get_objects()) - before < 100


def published(tmp_path, n: int = 12):
    index = tmp_path / "index"
    with IndexWriter.open(index) as writer:
        write_chunks(writer.folder / CHUNKS, chunks(n))
        writer.publish({"counts": {"chunks": n}})
    return index, resolve_generation(index) / CHUNKS


def test_publishing_records_the_digest_that_loading_checks(tmp_path):
    index, path = published(tmp_path)
    digest = read_manifest(index)[DIGEST_KEY]
    assert digest == file_sha256(path)
    assert len(read_chunks(path, digest, 12)) == 12
    data = path.read_bytes()
    path.write_bytes(data.replace(b"Passage 5:", b"Passage 6:"))  # still valid chunks, the same count
    with pytest.raises(IndexLoadError, match="changed after the generation was published"):
        read_chunks(path, digest, 12)


def test_a_damaged_line_is_named_with_or_without_a_digest(tmp_path):
    index, path = published(tmp_path)
    digest = read_manifest(index)[DIGEST_KEY]
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[4] = json.dumps({"doc_id": "x", "title": "t"}) + "\n"  # no text
    path.write_text("".join(lines), encoding="utf-8")
    for sha256 in (digest, None):
        with pytest.raises(IndexLoadError, match="line 5 is not a chunk"):
            read_chunks(path, sha256, 12)


def test_a_missing_line_is_a_count_the_manifest_does_not_have(tmp_path):
    index, path = published(tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-1]), encoding="utf-8")
    with pytest.raises(IndexLoadError, match="the manifest says 12 chunks but it holds 11"):
        read_chunks(path, read_manifest(index)[DIGEST_KEY], 12)


def test_with_a_matching_digest_no_line_is_parsed_at_load(tmp_path):
    """A line that is not a chunk, published so (its digest matches): loading does not parse it, asking for it does."""
    index = tmp_path / "index"
    with IndexWriter.open(index) as writer:
        write_chunks(writer.folder / CHUNKS, chunks(3))
        with open(writer.folder / CHUNKS, "a", encoding="utf-8") as fh:
            fh.write("not json\n")
        writer.publish({"counts": {"chunks": 4}})
    table = read_chunks(resolve_generation(index) / CHUNKS, read_manifest(index)[DIGEST_KEY], 4)
    assert table[0] == chunks(3)[0]
    with pytest.raises(IndexLoadError, match="line 4 is not a chunk"):
        table[3]


def test_a_table_parses_a_line_only_when_asked(tmp_path):
    write_chunks(tmp_path / CHUNKS, chunks(3))
    with open(tmp_path / CHUNKS, "a", encoding="utf-8") as fh:
        fh.write("not json\n")
    table = ChunkTable(tmp_path / CHUNKS)  # what a loader with a matching digest builds: no line parsed yet
    assert len(table) == 4 and table[2].text == chunks(3)[2].text
    with pytest.raises(IndexLoadError, match="line 4 is not a chunk"):
        table[3]
