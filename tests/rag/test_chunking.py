"""Chunkers measured in the real MiniLM word pieces, and the sentence splitter they share."""

from __future__ import annotations

import json

import pytest

from rag.index.chunks import read_chunks
from rag.index.store import CHUNKS, resolve_generation
from rag.ingest.chunking import SemanticDensityChunker, TokenWindowChunker, plain_tokenizer
from rag.ingest.pipeline import passage_text
from rag.ingest.sentences import sentence_spans
from rag.types import Document

PASTA = [
    "Bring a large pot of salted water to a rolling boil before adding the pasta.",
    "Stir the spaghetti during the first minute of cooking so the noodles do not stick together.",
    "Cook the pasta until it is al dente, which usually takes about nine minutes.",
    "Save a cup of the starchy pasta water to loosen the tomato sauce before serving the noodles.",
]
ORBITS = [
    "A satellite in low Earth orbit circles the planet roughly every ninety minutes.",
    "The orbital velocity of a satellite decreases as the altitude of its orbit increases.",
    "Kepler's laws describe how planets and satellites move along elliptical orbits.",
    "A transfer orbit raises a satellite from a low orbit to a higher elliptical orbit with two engine burns.",
]


@pytest.fixture(scope="module")
def tok(embedder):
    return plain_tokenizer(embedder.tokenizer)


@pytest.fixture(scope="module")
def abstracts(scifact_subset) -> list[Document]:
    rows = [json.loads(line) for line in (scifact_subset / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    return [Document(r["_id"], r["title"], r["text"]) for r in rows]


@pytest.fixture(scope="module")
def long_document(abstracts) -> Document:
    """One document of well over a thousand word pieces: ten abstracts run together."""
    return Document("long", "Collected abstracts", "\n\n".join(d.text for d in abstracts[:10]))


def count(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False).ids)


def splits_word(text: str, cut: int) -> bool:
    """A cut at character ``cut`` falls between two letters or digits of the same word."""
    return 0 < cut < len(text) and text[cut - 1].isalnum() and text[cut].isalnum()


def assert_spans_cover(text: str, spans, *, overlapping: bool):
    assert spans, "a document with text must give at least one chunk"
    assert spans[0][0] == len(text) - len(text.lstrip())
    assert spans[-1][1] == len(text.rstrip())
    for a, b in spans:
        assert 0 <= a < b <= len(text)
    for (a1, b1), (a2, b2) in zip(spans, spans[1:]):
        assert a2 > a1 and b2 > b1, "chunks must move forward through the text"
        if overlapping:
            assert a2 < b1, f"chunks {(a1, b1)} and {(a2, b2)} do not overlap"
        else:
            assert a2 >= b1 and text[b1:a2].strip() == "", f"text lost between {(a1, b1)} and {(a2, b2)}"


# -- TokenWindowChunker ------------------------------------------------------------------------------

def test_overlap_must_be_smaller_than_window(embedder):
    with pytest.raises(ValueError, match="overlap"):
        TokenWindowChunker(embedder.tokenizer, window=32, overlap=32)


def test_chunker_does_not_change_the_embedder_tokenizer(embedder):
    before = embedder.tokenizer.truncation
    TokenWindowChunker(embedder.tokenizer, window=32, overlap=8).split([Document("d", "", "word " * 600)])
    assert embedder.tokenizer.truncation == before
    assert before is not None and before["max_length"] == embedder.settings.max_seq_length


@pytest.mark.parametrize("window,overlap", [(64, 16), (240, 16), (100, 30)])
def test_token_windows_fit_the_window(embedder, tok, abstracts, long_document, window, overlap):
    chunker = TokenWindowChunker(embedder.tokenizer, window, overlap)
    documents = [*abstracts[:100], long_document]
    sizes = []
    for doc, spans in zip(documents, chunker.split(documents)):
        for a, b in spans:
            sizes.append(count(tok, doc.text[a:b]))
    assert max(sizes) <= window
    assert max(sizes) >= window - 8, "windows should be (nearly) full, not needlessly small"


def test_short_document_is_one_chunk(embedder):
    text = "  A short abstract about tides.\n"
    [spans] = TokenWindowChunker(embedder.tokenizer, 64, 16).split([Document("d", "Tides", text)])
    assert spans == [(2, len(text.rstrip()))]


def test_document_of_exactly_one_window_is_one_chunk(embedder, tok):
    text = " ".join(["river"] * 64)
    assert count(tok, text) == 64
    [spans] = TokenWindowChunker(embedder.tokenizer, 64, 16).split([Document("d", "", text)])
    assert spans == [(0, len(text))]


def test_empty_text_gives_no_chunks(embedder):
    assert TokenWindowChunker(embedder.tokenizer, 64, 16).split([Document("d", "t", "")]) == [[]]


@pytest.mark.parametrize("window,overlap", [(64, 16), (100, 30)])
def test_consecutive_windows_overlap_and_cover_the_text(embedder, tok, long_document, window, overlap):
    text = long_document.text
    [spans] = TokenWindowChunker(embedder.tokenizer, window, overlap).split([long_document])
    assert len(spans) > 10
    assert_spans_cover(text, spans, overlapping=True)
    offsets = tok.encode(text, add_special_tokens=False).offsets
    for (_, b1), (a2, _) in zip(spans, spans[1:]):
        shared = sum(1 for s, e in offsets if s >= a2 and e <= b1)
        assert shared >= overlap, f"only {shared} tokens shared, expected at least {overlap}"


def test_zero_overlap_windows_tile_the_text(embedder, long_document):
    [spans] = TokenWindowChunker(embedder.tokenizer, 64, 0).split([long_document])
    assert len(spans) > 10
    assert_spans_cover(long_document.text, spans, overlapping=False)


@pytest.mark.parametrize("window,overlap", [(64, 16), (240, 16), (100, 30), (48, 0)])
def test_windows_end_on_word_boundaries(embedder, abstracts, long_document, window, overlap):
    documents = [*abstracts, long_document]
    bad = [(doc.doc_id, doc.text[max(0, b - 15):b] + "|" + doc.text[b:b + 15])
           for doc, spans in zip(documents, TokenWindowChunker(embedder.tokenizer, window, overlap).split(documents))
           for _, b in spans if splits_word(doc.text, b)]
    assert bad == []


@pytest.mark.parametrize("window,overlap", [(64, 16), (240, 16), (100, 30), (48, 0)])
def test_windows_start_on_word_boundaries(embedder, abstracts, long_document, window, overlap):
    """The overlap must not begin a chunk with the tail of a word ("...clonal|ly distinct")."""
    documents = [*abstracts, long_document]
    bad = [(doc.doc_id, doc.text[max(0, a - 15):a] + "|" + doc.text[a:a + 15])
           for doc, spans in zip(documents, TokenWindowChunker(embedder.tokenizer, window, overlap).split(documents))
           for a, _ in spans if splits_word(doc.text, a)]
    assert bad == [], f"{len(bad)} chunks start inside a word, e.g. {bad[:3]}"


def test_word_longer_than_the_window_is_still_cut(embedder, tok):
    """When one word has more pieces than the window, splitting it is unavoidable and must still work."""
    # WordPiece maps words over 100 characters to a single [UNK], so stay just under that.
    sequence = ("ACGTTGCAAGCTTAGGCTAACGGTACCGATGCTAGCATCGATCGTAGCTAGCTAGGATCCATGCAGT" * 2)[:96]
    text = f"The probe sequence {sequence} was synthesised and tested twice."
    assert count(tok, sequence) > 40
    [spans] = TokenWindowChunker(embedder.tokenizer, 16, 4).split([Document("d", "", text)])
    assert 3 <= len(spans) <= 10
    # Count the document's own pieces inside each span: re-tokenising half a word would differ.
    offsets = tok.encode(text, add_special_tokens=False).offsets
    assert all(sum(1 for s, e in offsets if a <= s and e <= b) <= 16 for a, b in spans)
    assert_spans_cover(text, spans, overlapping=True)


def test_long_title_shrinks_the_window(embedder, tok, long_document):
    text = long_document.text
    budget = 254
    short_title = "Tides"
    long_title = " ".join(["oceanography"] * 45)
    assert 80 <= count(tok, long_title) <= 120
    chunker = TokenWindowChunker(embedder.tokenizer, 240, 16, budget=budget)
    short_spans, long_spans = chunker.split([Document("a", short_title, text), Document("b", long_title, text)])
    short_sizes = [count(tok, text[a:b]) for a, b in short_spans]
    long_sizes = [count(tok, text[a:b]) for a, b in long_spans]
    assert max(short_sizes) <= 240 and max(short_sizes) > budget - count(tok, long_title)
    assert all(n + count(tok, long_title) <= budget for n in long_sizes)
    assert len(long_spans) > len(short_spans)


def test_title_budget_never_shrinks_below_half_the_window(embedder, tok, long_document):
    text = long_document.text
    huge_title = " ".join(["oceanography"] * 115)
    assert count(tok, huge_title) > 220
    [spans] = TokenWindowChunker(embedder.tokenizer, 240, 16, budget=254).split([Document("d", huge_title, text)])
    sizes = [count(tok, text[a:b]) for a, b in spans]
    assert max(sizes) <= 120
    assert max(sizes) > 254 - count(tok, huge_title)  # the floor, not the (negative) budget, applies
    assert_spans_cover(text, spans, overlapping=True)


def test_ingested_passages_fit_the_encoder_untruncated(subset_index, embedder, tok):
    """What ingest embeds (title + chunk) never exceeds max_seq_length with [CLS]/[SEP] added."""
    chunks = read_chunks(resolve_generation(subset_index) / CHUNKS)
    assert len(chunks) > 300
    limit = embedder.settings.max_seq_length
    titles = {c.title for c in chunks}
    # Titles longer than half the window may be truncated by design; SciFact has none of those.
    budgeted = {t for t in titles if count(tok, t) < (limit - 2) // 2}
    assert budgeted == titles
    too_long = [c.chunk_id for c in chunks if count(tok, passage_text(c)) + 2 > limit]
    assert too_long == []


# -- SemanticDensityChunker --------------------------------------------------------------------------

def semantic(embedder, threshold=0.3, min_tokens=1, max_tokens=200):
    return SemanticDensityChunker(embedder.tokenizer, embedder.embed_many, threshold, min_tokens, max_tokens)


def test_semantic_min_above_max_is_rejected(embedder):
    with pytest.raises(ValueError, match="min_tokens"):
        semantic(embedder, min_tokens=100, max_tokens=50)


def test_semantic_cuts_at_the_topic_change(embedder):
    text = " ".join(PASTA + ORBITS)
    topic_change = text.index(ORBITS[0])
    [spans] = semantic(embedder, threshold=0.3, min_tokens=8).split([Document("d", "Notes", text)])
    assert spans == [(0, topic_change - 1), (topic_change, len(text))]
    assert "orbit" not in text[slice(*spans[0])]
    assert "pasta" not in text[slice(*spans[1])]


def test_semantic_default_threshold_also_separates_the_topics(embedder):
    text = " ".join(PASTA + ORBITS)
    topic_change = text.index(ORBITS[0])
    [spans] = semantic(embedder, threshold=0.45, min_tokens=8).split([Document("d", "Notes", text)])
    assert any(a == topic_change for a, _ in spans)
    for a, b in spans:  # no chunk mixes the two topics
        assert b <= topic_change or a >= topic_change


def test_semantic_large_min_tokens_keeps_one_chunk(embedder, tok):
    """The cut above is semantic: with min_tokens above the document's size there is none."""
    text = " ".join(PASTA + ORBITS)
    assert count(tok, text) < 200
    [spans] = semantic(embedder, threshold=0.3, min_tokens=200, max_tokens=200).split([Document("d", "", text)])
    assert spans == [(0, len(text))]


def test_semantic_chunks_never_exceed_max_tokens(embedder, tok, abstracts):
    documents = abstracts[:60]
    chunker = semantic(embedder, threshold=0.45, min_tokens=16, max_tokens=48)
    total = 0
    for doc, spans in zip(documents, chunker.split(documents)):
        sentences = sentence_spans(doc.text)
        for a, b in spans:
            assert count(tok, doc.text[a:b]) <= 48, doc.text[a:b]
        assert_spans_cover(doc.text, spans, overlapping=False)
        # Cuts fall on sentence boundaries unless the sentence itself is longer than max_tokens.
        starts = {s for s, _ in sentences}
        for a, b in spans:
            if a not in starts:
                enclosing = next((s, e) for s, e in sentences if s <= a < e)
                assert count(tok, doc.text[slice(*enclosing)]) > 48
        total += len(spans)
    assert total > len(documents)


def test_semantic_windows_an_over_long_sentence(embedder, tok):
    first = "Short opening sentence about cells."
    long_sentence = ("The cohort included " + ", ".join(f"patient group {i} treated with compound {i}"
                                                       for i in range(40)) + " in total.")
    last = "A short closing sentence about mice."
    text = f"{first} {long_sentence} {last}"
    assert count(tok, long_sentence) > 5 * 64
    assert sentence_spans(text) == [(0, len(first)), (len(first) + 1, len(first) + 1 + len(long_sentence)),
                                    (len(text) - len(last), len(text))]
    [spans] = semantic(embedder, threshold=-1.0, min_tokens=64, max_tokens=64).split([Document("d", "", text)])
    assert spans[0] == (0, len(first)), "the sentence before the long one is flushed on its own"
    windows = spans[1:-1]
    assert len(windows) >= 5
    assert all(count(tok, text[a:b]) <= 64 for a, b in spans)
    assert windows[0][0] == len(first) + 1 and windows[-1][1] == len(first) + 1 + len(long_sentence)
    assert_spans_cover(text, spans, overlapping=False)
    assert spans[-1] == (len(text) - len(last), len(text))


def test_semantic_empty_document_gives_no_chunks(embedder):
    assert semantic(embedder).split([Document("a", "t", ""), Document("b", "", "One sentence.")]) == \
        [[], [(0, len("One sentence."))]]


# -- sentence_spans -----------------------------------------------------------------------------------

def sentences(text: str) -> list[str]:
    return [text[a:b] for a, b in sentence_spans(text)]


@pytest.mark.parametrize("text,expected", [
    ("Use a mild solvent, e.g. the one in Table 2. It worked.",
     ["Use a mild solvent, e.g. the one in Table 2.", "It worked."]),
    ("Compare groups, i.e. treated vs. untreated ones. Then report.",
     ["Compare groups, i.e. treated vs. untreated ones.", "Then report."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("She asked 'why?' Nobody answered.", ["She asked 'why?'", "Nobody answered."]),
    ("(See the appendix.) The results follow.", ["(See the appendix.)", "The results follow."]),
    ("It was found [ref.] The end.", ["It was found [ref.]", "The end."]),
    ('It ended. "Next," she said.', ["It ended.", '"Next," she said.']),
    ("The dose was 2.5 mg per day. 42 patients responded.",
     ["The dose was 2.5 mg per day.", "42 patients responded."]),
    ("Python 3.11 is used. Version 2.7 is not.", ["Python 3.11 is used.", "Version 2.7 is not."]),
    ("Is it safe? Yes! It is.", ["Is it safe?", "Yes!", "It is."]),
    ("Wait... Then it happened.", ["Wait...", "Then it happened."]),
    ("The ratio was approx. three to one.", ["The ratio was approx. three to one."]),
    ("No final punctuation here", ["No final punctuation here"]),
    ("  Leading and trailing space.   Second one.\n\n", ["Leading and trailing space.", "Second one."]),
    ("First line.\nSecond line.\n\nThird (after a blank line).",
     ["First line.", "Second line.", "Third (after a blank line)."]),
    ("p < 0.05 (n = 12). (Brackets) open the next.", ["p < 0.05 (n = 12).", "(Brackets) open the next."]),
])
def test_sentence_spans_on_tricky_text(text, expected):
    assert sentences(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "\n\t\n"])
def test_sentence_spans_of_blank_text(text):
    assert sentence_spans(text) == []


def test_sentence_spans_are_ordered_trimmed_and_disjoint(abstracts):
    for doc in abstracts[:100]:
        spans = sentence_spans(doc.text)
        assert spans
        for a, b in spans:
            assert doc.text[a:b] == doc.text[a:b].strip() and a < b
        for (_, b1), (a2, _) in zip(spans, spans[1:]):
            assert b1 < a2 and doc.text[b1:a2].strip() == ""
