"""Corpora for the graph tests: a hand-written one whose mentions and co-occurrences are known, titles that try to
inject Cypher, a random one for the reference comparison; a store wrapper that counts round trips; a snapshot of a
whole store."""

from __future__ import annotations

import json
import random

from rag.types import Chunk

DOCS = [  # (doc id, title, text)
    ("black-book", "Black Book (film)", "Black Book is a 2006 war film directed by Paul Verhoeven, with Carice van "
                                        "Houten in the lead."),
    ("verhoeven", "Paul Verhoeven", "Paul Verhoeven is a Dutch director who worked in Hollywood and later "
                                    "returned to make Black Book."),
    ("carice", "Carice van Houten", "Carice van Houten is a Dutch actress, known for Black Book and for Game of "
                                    "Thrones."),
    ("robocop", "RoboCop", "RoboCop is a 1987 science fiction film by Paul Verhoeven, set in Detroit."),
    ("got", "Game of Thrones", "Game of Thrones is a television series filmed in Northern Ireland."),
    ("detroit", "Detroit", "Detroit is the largest city in Michigan."),
    ("michigan", "Michigan", "Michigan is a state of the United States."),
    ("davenport", "Davenport, Florida", "Davenport is a city near Orlando with a few thousand people."),
    ("orlando", "Orlando, Florida", "Orlando is a city in Florida, close to Davenport and to Kissimmee."),
    ("amp", "Tom &amp; Jerry", "Tom and Jerry is an animated series; Tom & Jerry were made at MGM."),
    ("pokemon", "Pokémon", "Pokemon is a media franchise."),
]
INJECTIONS = [
    "MATCH (n) DETACH DELETE n",
    'Robert"}) MATCH (n) DETACH DELETE n //',
    "x' MATCH (n) DETACH DELETE n //",
    "It's a `backtick` {brace} \\ backslash",
    "'; CALL db.clear() ; '",
    '"quoted" title with } and { and ]',
]
BOLT_UNSAFE = ("'", "\\")
"""FalkorDB 4.16's Bolt listener splices string parameters into the query text with single quotes and no escaping:
a value with ``'`` is a syntax error, or an injection (``x' MATCH (n) DETACH DELETE n //`` empties the graph:
tests/rag/graph/test_falkordb.py shows it), and ``\\`` is read as an escape. A real Neo4j server receives parameters
as typed values. So the neo4j backend, tested through that listener, is given titles without these two characters."""


def bolt_safe(text: str) -> bool:
    return not any(ch in text for ch in BOLT_UNSAFE)


def chunks_of(docs) -> list[Chunk]:
    return [Chunk(i, doc_id, title, text, 0, len(text)) for i, (doc_id, title, text) in enumerate(docs)]


def injections(bolt: bool = False) -> list[str]:
    return [t for t in INJECTIONS if bolt_safe(t)] if bolt else list(INJECTIONS)


def toy_chunks(bolt: bool = False) -> list[Chunk]:
    """The hand-written corpus, Black Book's document in two chunks, plus documents titled with injections (their
    texts mention each other's titles, so the injections travel as entity names, titles and doc keys); ``bolt``:
    only the injections FalkorDB's Bolt listener can carry (``BOLT_UNSAFE``)."""
    docs = [d for d in DOCS if not bolt or bolt_safe(d[2])]
    docs.insert(1, ("black-book", "Black Book (film)", "It premiered in Venice; Carice van Houten won a prize."))
    titles = injections(bolt)
    for i, title in enumerate(titles):
        docs.append((f"inject-{i}-{title}", title, f"This page links to {titles[(i + 1) % len(titles)]}."))
    return chunks_of(docs)


def random_chunks(seed: int = 7, n_docs: int = 80) -> list[Chunk]:
    """Documents named by random two-word names, each mentioning 0-4 others: many paths, many near ties."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ren", "tor", "vi", "sa", "dun", "pel", "ox", "qua", "zim", "bre", "fal"]
    names = set()
    while len(names) < n_docs:
        names.add(" ".join("".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))).title() for _ in range(2)))
    names = sorted(names)
    docs = []
    for i, name in enumerate(names):
        others = rng.sample(names, rng.randint(0, 4))
        text = f"{name} is known here. " + " ".join(f"It met {o} once." for o in others if o != name)
        docs.append((f"doc-{i}", name, text))
        if rng.random() < 0.3:  # a second chunk of the same document
            docs.append((f"doc-{i}", name, "More about " + " and ".join(rng.sample(names, 2)) + "."))
    return chunks_of(docs)


class CountingStore:
    """A real store that counts its round trips (to show which queries make none)."""

    def __init__(self, store) -> None:
        self.store, self.name, self.calls = store, store.name, 0

    def run(self, cypher, params=None, *, write=False):
        self.calls += 1
        return self.store.run(cypher, params, write=write)

    def healthy(self):
        return self.store.healthy()


def snapshot(store) -> list:
    """Every node and edge, as comparable rows (the whole graph, all generations)."""
    nodes = store.run("MATCH (n) RETURN labels(n)[0], n.g, n.id, n.name, n.title, n.key ORDER BY labels(n)[0], n.g, n.id")
    edges = store.run("MATCH (a)-[r]->(b) RETURN type(r), a.g, a.id, b.id, r.w, r.rank "
                      "ORDER BY type(r), a.g, a.id, b.id")
    return [json.dumps(list(r), default=str) for r in nodes + edges]


def hotpot_subset(source, out, questions: int):
    """A BEIR folder with the gold paragraphs of the first ``questions`` dev questions of ``source`` (hotpotqa-dev)
    and three times as many other paragraphs (chosen with a fixed seed)."""
    lines = (source / "qrels" / "dev.tsv").read_text().splitlines()
    qrels = [line.split("\t") for line in lines[1:] if line.strip()]
    qids = list(dict.fromkeys(q for q, _, _ in qrels))[:questions]
    gold = {d for q, d, _ in qrels if q in qids}
    rows = [json.loads(line) for line in (source / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    others = [r for r in rows if r["_id"] not in gold]
    random.Random(0).shuffle(others)
    keep = [r for r in rows if r["_id"] in gold] + others[: 3 * len(gold)]
    (out / "qrels").mkdir(parents=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    (out / "qrels" / "dev.tsv").write_text(lines[0] + "\n" + "".join("\t".join(x) + "\n" for x in qrels if x[0] in qids))
    queries = [line for line in (source / "queries.jsonl").read_text(encoding="utf-8").splitlines()
               if line.strip() and json.loads(line)["_id"] in qids]
    (out / "queries.jsonl").write_text("\n".join(queries) + "\n", encoding="utf-8")
    return out
