"""Sections about growing the corpus: what the reranker's stored token vectors cost at scale, compressed."""

from __future__ import annotations

from rag.settings import RerankSettings

from .stats import bold, count, join_words, num, signed, table


def token_codes(d: dict) -> str:
    t = d["token-codes"]
    codes, sets, choice = t["codes"], t["sets"], t["choice"]
    at = t["at_chunks"]
    rows = []
    for name, s in sets.items():
        for dtype in ["int8", *codes]:
            size, quality = s["sizes"][dtype], s["quality"][dtype]
            wall, cpu = s["rerank_ms"][dtype], s["rerank_cpu_ms"][dtype]
            diff = "–" if dtype == "int8" else (
                f"{signed(quality['difference'], 4)} ± {num(quality['difference_se'], 4)} "
                f"({count(quality['better'])} / {count(quality['worse'])})")
            rows.append([name, bold(dtype) if dtype == choice["smallest_within"] else dtype,
                         count(size["bytes_per_token"]), num(size["bytes_per_chunk"] / 1024, 1),
                         num(size[f"gib_at_{at}"], 1), num(quality["ndcg@10"], 4), diff,
                         f"{num(wall['p50'])} / {num(wall['p99'])}", f"{num(cpu['p50'])} / {num(cpu['p99'])}",
                         "–" if dtype == "int8" else num(size["build_s"], 0)])
    first = next(iter(sets.values()))
    within = join_words([f"`{c}`" for c in choice["within"]]) or "none"
    smallest = choice["smallest_within"]
    # A loss within the target by less than its standard error may be past it on other questions.
    close = [name for name, s in sets.items() if smallest and
             choice["max_loss"] + s["quality"][smallest]["difference"] < s["quality"][smallest]["difference_se"]]
    caution = (f" On {join_words(close)} its loss is within the target by less than its standard error:\non other "
               f"questions it may be past it, and the next larger code within the target is the safer choice."
               if close else "")
    return f"""\
The reranker keeps every chunk's token vectors (`rerank.store_tokens`); at int8 they are most of an index, and
a corpus of {count(at)} chunks would not fit this machine's memory. Product codes (`rerank.token_dtype` `pq64`,
`pq32`, `pq16`: bytes a token, after a learnt rotation, as ColBERTv2 and PLAID compress theirs) are learnt here from
the same index's int8 vectors, as `ragheat ingest` learns them, and served by the same reranker on the same fused
candidates ({count(first['candidates'])} a query), with the shipped head. nDCG@10 of hybrid + rerank over every
judged query, the difference against int8 paired query by query (± its standard error; queries better / worse);
the rerank stage alone, P50 / P99 ms, wall and this thread's CPU, the dtypes interleaved. The size at
{count(at)} chunks is arithmetic (this set's mean tokens per chunk times the bytes a token), not a run.

{table(["set", "token vectors", "bytes a token", "KiB a chunk", f"GiB at {count(at)} chunks", "nDCG@10",
        "difference", "rerank ms", "rerank CPU ms", "build s"], rows, "llrrrrlrrr")}

Within {num(choice['max_loss'], 3)} nDCG@10 of int8 on every set: {within}; the smallest of them is
{bold(smallest or 'none')}.{caution} The default is `{RerankSettings().token_dtype}`; docs/scale.md says when to
switch."""
