"""Reading corpora: BEIR folders, folders of .txt/.md files, and the packaged ``wiki`` corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag.errors import IngestError
from rag.ingest.sources import load_source


def write_beir(folder: Path, rows: list, extra_lines: list[str] = ()) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) if not isinstance(r, str) else r for r in rows]
    (folder / "corpus.jsonl").write_text("\n".join([*lines, *extra_lines]) + "\n", encoding="utf-8")
    return folder


# -- BEIR ------------------------------------------------------------------------------------------

def test_beir_subset_ids_titles_and_texts(scifact_subset):
    rows = [json.loads(line) for line in (scifact_subset / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    corpus = load_source(str(scifact_subset))
    assert corpus.kind == "beir"
    assert corpus.name == scifact_subset.name
    assert corpus.location == str(scifact_subset.resolve())
    assert len(corpus.documents) == len(rows) == 300
    assert [d.doc_id for d in corpus.documents] == [str(r["_id"]) for r in rows]
    assert [d.title for d in corpus.documents] == [r["title"].strip() for r in rows]
    assert [d.text for d in corpus.documents] == [r["text"].strip() for r in rows]
    assert corpus.skipped_empty == 0 and corpus.skipped_duplicate == 0
    assert len(corpus.content_sha256) == 64


def test_beir_numeric_ids_missing_title_and_blank_lines(tmp_path):
    folder = write_beir(tmp_path / "b", [
        {"_id": 7, "title": "Seven", "text": "  The seventh document.  "},
        {"_id": "x", "text": "No title field at all."},
        {"_id": "t", "title": "Only a title", "text": ""},
        {"_id": "n", "title": None, "text": "Null title."},
    ], extra_lines=["", "   "])
    corpus = load_source(str(folder))
    docs = {d.doc_id: d for d in corpus.documents}
    assert list(docs) == ["7", "x", "t", "n"]
    assert docs["7"].title == "Seven" and docs["7"].text == "The seventh document."
    assert docs["x"].title == "" and docs["x"].text == "No title field at all."
    assert docs["t"].text == "Only a title"  # a title-only row is still searchable by its title
    assert docs["n"].title == "" and docs["n"].text == "Null title."


def test_beir_empty_and_duplicate_documents_are_counted(tmp_path):
    folder = write_beir(tmp_path / "b", [
        {"_id": "1", "title": "A", "text": "First."},
        {"_id": "2", "title": "", "text": ""},
        {"_id": "3", "title": "  ", "text": " \n "},
        {"_id": "1", "title": "A again", "text": "A second document with an id already seen."},
        {"_id": "4", "title": "D", "text": "Fourth."},
        {"_id": "4", "title": "D", "text": "Fourth."},
    ])
    corpus = load_source(str(folder))
    assert [d.doc_id for d in corpus.documents] == ["1", "4"]
    assert corpus.documents[0].text == "First."  # the first occurrence wins
    assert corpus.skipped_empty == 2
    assert corpus.skipped_duplicate == 2


@pytest.mark.parametrize("bad_line", [
    '{"_id": "2", "text": "unterminated',   # broken JSON
    '{"title": "no id", "text": "x"}',        # no _id
    '["a", "list"]',                          # not an object
    '{"_id": "2", "text": 42}',               # text is not a string
])
def test_beir_malformed_line_names_file_and_line(tmp_path, bad_line):
    folder = write_beir(tmp_path / "b", [{"_id": "1", "title": "A", "text": "Fine."}, "", bad_line])
    with pytest.raises(IngestError) as info:
        load_source(str(folder))
    assert f"{folder / 'corpus.jsonl'}:3" in str(info.value)


def test_beir_corpus_not_utf8_names_the_file(tmp_path):
    folder = tmp_path / "b"
    folder.mkdir()
    (folder / "corpus.jsonl").write_bytes(b'{"_id": "1", "text": "caf\xe9 au lait"}\n')
    with pytest.raises(IngestError) as info:
        load_source(str(folder))
    assert str(folder / "corpus.jsonl") in str(info.value)


def test_beir_corpus_with_no_text_is_an_error(tmp_path):
    folder = write_beir(tmp_path / "b", [{"_id": "1", "title": "", "text": ""}])
    with pytest.raises(IngestError) as info:
        load_source(str(folder))
    assert str(folder.resolve()) in str(info.value)


# -- text folders ----------------------------------------------------------------------------------

@pytest.fixture
def text_folder(tmp_path) -> Path:
    root = tmp_path / "notes"
    (root / "deep" / "deeper").mkdir(parents=True)
    (root / "tides.txt").write_text("Tides are caused by the Moon.\nThey rise twice a day.\n", encoding="utf-8")
    (root / "volcano_facts.md").write_text("\n# Volcanoes of Iceland\n\nIceland has about 130 volcanoes.\n",
                                           encoding="utf-8")
    (root / "no-heading.md").write_text("Plain markdown without a heading.", encoding="utf-8")
    (root / "deep" / "deeper" / "glaciers.txt").write_text("Glaciers carve valleys.", encoding="utf-8")
    (root / "deep" / "SHOUT.TXT").write_text("Upper-case suffix still counts.", encoding="utf-8")
    for ignored in ("data.json", "page.html", "notes.rst", "script.py", "README"):
        (root / ignored).write_text("Must not be read: ignored suffix.", encoding="utf-8")
    (root / "deep" / "binary.bin").write_bytes(b"\xff\xfe\x00")
    return root


def test_text_folder_reads_txt_and_md_recursively(text_folder):
    corpus = load_source(str(text_folder))
    assert corpus.kind == "folder"
    assert corpus.name == "notes"
    docs = {d.doc_id: d for d in corpus.documents}
    assert set(docs) == {"tides.txt", "volcano_facts.md", "no-heading.md", "deep/deeper/glaciers.txt",
                         "deep/SHOUT.TXT"}
    assert all("ignored suffix" not in d.text for d in corpus.documents)


def test_text_folder_heading_becomes_title_and_leaves_the_body(text_folder):
    docs = {d.doc_id: d for d in load_source(str(text_folder)).documents}
    volcano = docs["volcano_facts.md"]
    assert volcano.title == "Volcanoes of Iceland"
    assert volcano.text == "Iceland has about 130 volcanoes."
    assert "#" not in volcano.text


def test_text_folder_title_falls_back_to_file_name(text_folder):
    docs = {d.doc_id: d for d in load_source(str(text_folder)).documents}
    assert docs["tides.txt"].title == "tides"
    assert docs["tides.txt"].text == "Tides are caused by the Moon.\nThey rise twice a day."
    assert docs["no-heading.md"].title == "no heading"
    assert docs["no-heading.md"].text == "Plain markdown without a heading."
    assert docs["deep/deeper/glaciers.txt"].title == "glaciers"


def test_text_folder_empty_files_are_counted_not_indexed(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "real.txt").write_text("Some real text.", encoding="utf-8")
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "blank.md").write_text("  \n\n\t\n", encoding="utf-8")
    corpus = load_source(str(root))
    assert [d.doc_id for d in corpus.documents] == ["real.txt"]
    assert corpus.skipped_empty == 2


def test_text_folder_of_only_empty_files_is_an_error(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "empty.txt").write_text("", encoding="utf-8")
    (root / "blank.md").write_text("   \n", encoding="utf-8")
    with pytest.raises(IngestError) as info:
        load_source(str(root))
    assert str(root) in str(info.value)


def test_text_folder_non_utf8_file_names_the_file(tmp_path):
    root = tmp_path / "t"
    (root / "sub").mkdir(parents=True)
    (root / "good.txt").write_text("Fine text.", encoding="utf-8")
    (root / "sub" / "latin1.txt").write_bytes("Caf\u00e9 cr\u00e8me".encode("latin-1"))
    with pytest.raises(IngestError) as info:
        load_source(str(root))
    assert str(root / "sub" / "latin1.txt") in str(info.value)


def test_empty_folder_is_an_error(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    with pytest.raises(IngestError) as info:
        load_source(str(root))
    assert str(root) in str(info.value)


def test_folder_with_only_ignored_suffixes_is_an_error(tmp_path):
    root = tmp_path / "other"
    root.mkdir()
    (root / "a.json").write_text("{}", encoding="utf-8")
    (root / "b.html").write_text("<p>hi</p>", encoding="utf-8")
    with pytest.raises(IngestError) as info:
        load_source(str(root))
    assert str(root) in str(info.value)


def test_missing_path_is_an_error(tmp_path):
    missing = tmp_path / "does" / "not" / "exist"
    with pytest.raises(IngestError) as info:
        load_source(str(missing))
    assert str(missing) in str(info.value)


def test_plain_file_is_an_error(tmp_path, scifact_subset):
    for path in (scifact_subset / "corpus.jsonl", tmp_path / "note.txt"):
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text("A single text file.", encoding="utf-8")
        with pytest.raises(IngestError) as info:
            load_source(str(path))
        assert str(path) in str(info.value)


# -- content hash ----------------------------------------------------------------------------------

def test_content_sha256_is_stable_and_tracks_text_changes(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "a.txt").write_text("Alpha text.", encoding="utf-8")
    (root / "b.txt").write_text("Beta text.", encoding="utf-8")
    first = load_source(str(root)).content_sha256
    assert load_source(str(root)).content_sha256 == first

    (root / "b.txt").write_text("Beta text, edited.", encoding="utf-8")
    edited = load_source(str(root)).content_sha256
    assert edited != first

    (root / "b.txt").write_text("Beta text.", encoding="utf-8")
    assert load_source(str(root)).content_sha256 == first

    (root / "c.md").write_text("# New\nA new document.", encoding="utf-8")
    assert load_source(str(root)).content_sha256 not in (first, edited)


def test_content_sha256_tracks_titles_and_ids(tmp_path):
    base = {"_id": "1", "title": "Title", "text": "Same text."}
    digests = set()
    for i, row in enumerate([base, {**base, "title": "Other title"}, {**base, "_id": "2"}]):
        digests.add(load_source(str(write_beir(tmp_path / f"b{i}", [row]))).content_sha256)
    assert len(digests) == 3


def test_content_sha256_does_not_confuse_field_boundaries(tmp_path):
    one = write_beir(tmp_path / "one", [{"_id": "1", "title": "ab", "text": "c"}])
    two = write_beir(tmp_path / "two", [{"_id": "1", "title": "a", "text": "bc"}])
    assert load_source(str(one)).content_sha256 != load_source(str(two)).content_sha256


# -- wiki ------------------------------------------------------------------------------------------

def test_wiki_corpus_has_10033_documents_with_text():
    corpus = load_source("wiki")
    assert corpus.kind == "wiki"
    assert len(corpus.documents) == 10_033
    assert all(d.text.strip() for d in corpus.documents)
    assert all(d.title.strip() for d in corpus.documents)
    assert len({d.doc_id for d in corpus.documents}) == 10_033
    assert Path(corpus.location).is_file()
