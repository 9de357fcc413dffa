"""Names, the gazetteer and the built graph, on the hand-written corpus whose links are known."""

from __future__ import annotations

import pytest

from rag.graph.aliases import Gazetteer, normalise, title_aliases, usable_alias
from rag.graph.build import build_graph
from rag.graph.linker import GazetteerLinker

from graph_testkit import chunks_of, toy_chunks


@pytest.mark.parametrize("text, expected", [
    ("Pokémon: The  Movie", "pokemon the movie"),
    ("Tom &amp; Jerry", "tom jerry"),
    ("Ångström (unit)", "angstrom unit"),
    ("Москва", "москва"),
    ("snake_case--and...dots", "snake case and dots"),
])
def test_normalise_folds_case_accents_entities_and_punctuation(text, expected):
    assert normalise(text) == expected


def test_aliases_of_a_title():
    assert dict(title_aliases("Black Book (film)")) == {"black book film": 1.0, "black book": 0.8}
    assert dict(title_aliases("The Beatles")) == {"the beatles": 1.0, "beatles": 0.9}
    assert dict(title_aliases("Davenport, Florida")) == {"davenport florida": 1.0, "davenport": 0.6}


def test_only_short_name_comma_qualifier_titles_are_cut_at_the_comma():
    sentence = "Loss, trauma, and human resilience: have we underestimated the human capacity?"
    assert "loss" not in dict(title_aliases(sentence))
    assert "loss" in dict(title_aliases(sentence, comma="all"))
    assert "davenport" not in dict(title_aliases("Davenport, Florida", comma="none"))
    assert "diabetes" not in dict(title_aliases("Diabetes, metabolic syndrome and obesity: what links them?"))


def test_words_and_numbers_are_not_aliases():
    assert not usable_alias("film") and not usable_alias("the") and not usable_alias("1987") and not usable_alias("ab")
    assert usable_alias("robocop")


def test_the_gazetteer_finds_whole_words_longest_first_without_overlap():
    gazetteer = Gazetteer(["new york", "new york city", "york", "city hall", "hall"])
    assert gazetteer.find("the new york city hall opened") == ["new york city", "hall"]
    assert gazetteer.find("newyork yorkshire") == []
    assert gazetteer.find("new york and city hall") == ["city hall", "new york"]  # longest first
    assert Gazetteer([]).find("anything") == []


def test_the_graph_of_the_hand_written_corpus(toy_graph):
    g = toy_graph
    entity = {name: e for e, name in enumerate(g.entity_names)}
    black_book, verhoeven = entity["black book film"], entity["paul verhoeven"]
    assert g.entity_titles[entity["tom jerry"]] == "Tom & Jerry"  # HTML entity decoded
    assert g.entity_chunks[black_book] == [0, 1]  # one entity, its document's two chunks
    assert g.chunk_mentions[0][verhoeven] == pytest.approx(1.0)  # "Paul Verhoeven" in Black Book's first chunk
    assert black_book not in g.chunk_mentions[0], "a chunk does not mention its own entity"
    neighbours = dict(g.co_occurs[black_book])
    assert verhoeven in neighbours and entity["carice van houten"] in neighbours
    assert max(w for _, w in g.co_occurs[black_book]) == pytest.approx(1.0)  # scaled to the best edge
    weights = [w for _, w in g.co_occurs[black_book]]
    assert weights == sorted(weights, reverse=True)  # rank = position
    for a, edges in g.co_occurs.items():  # co-occurrence is symmetric
        for b, _ in edges:
            assert a in dict(g.co_occurs[b])


def test_an_alias_found_in_too_many_chunks_makes_no_mention():
    docs = [("d0", "Zorbland", "Zorbland is a place.")]
    docs += [(f"d{i}", f"Thing {i}", f"Thing {i} is near Zorbland.") for i in range(1, 6)]
    assert build_graph(chunks_of(docs), max_alias_df=1.0).stats["mentions"] == 5
    common = build_graph(chunks_of(docs), max_alias_df=0.1)  # in all 6 chunks: a word here, not a name
    assert common.stats["mentions"] == 0 and common.stats["aliases_too_common"] == 1


def test_chunks_must_come_in_id_order():
    chunks = toy_chunks()
    with pytest.raises(ValueError, match="chunk-id order"):
        build_graph(chunks[1:])


def test_the_linker_weighs_seeds_by_prior_specificity_and_ambiguity(toy_graph, tmp_path):
    linker = GazetteerLinker.from_graph(toy_graph)
    entity = {name: e for e, name in enumerate(toy_graph.entity_names)}
    seeds = linker.link("Did Paul Verhoeven make RoboCop?").seeds
    assert set(seeds) == {entity["paul verhoeven"], entity["robocop"]}
    assert all(0 < w <= 1 for w in seeds.values())
    assert linker.link("nothing to see here").seeds == {}
    # "davenport" (prior 0.6) seeds less than the full "davenport florida" (prior 1.0) would.
    short = linker.link("Where is Davenport?").seeds[entity["davenport florida"]]
    full = linker.link("Where is Davenport, Florida?").seeds[entity["davenport florida"]]
    assert short < full
    linker.save(tmp_path)
    assert GazetteerLinker.load(tmp_path).link("Did Paul Verhoeven make RoboCop?").seeds == seeds


def test_linking_by_embedding_adds_the_nearest_titles_as_weaker_seeds(toy_graph):
    import numpy as np

    n = len(toy_graph.entity_names)
    vectors = np.eye(n, dtype=np.float32)
    linker = GazetteerLinker.from_graph(toy_graph, entity_vectors=vectors, embedding_seeds=1,
                                        embedding_min_similarity=0.5, embedding_seed_weight=0.3)
    assert linker.needs_vector
    seeds = linker.link("nothing named here", vectors[3]).seeds
    assert seeds == {3: pytest.approx(0.3)}
    assert linker.link("nothing named here", -vectors[3]).seeds == {}  # below the least similarity
