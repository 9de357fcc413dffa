"""LLM-as-judge (``ragheat judge``): the language model labels each retrieved (query, passage) pair relevant or not,
the labels are written as BEIR qrels, and compared with the human qrels.

The prompt asks for one word. From an OpenAI-compatible server (``YesNoClient``) one token is asked for with its top
log-probabilities, and the label is log P(Yes) - log P(No) > ``threshold``. Otherwise (``CompleterAsker``: the
in-process engine) the reply is held to ``Yes`` or ``No`` by structured outputs (``JUDGE_REGEX``) where the server has
them, and the parser reads free text anyway (``parse_label``: the earliest yes/no-like word, "not relevant" before
"relevant"), so a model that rambles is read too. A reply with neither is *unparsed*: counted, not written, and asked
again on the next run.

The out file is BEIR qrels (``query-id	corpus-id	score``, score 1 or 0, the header first), appended and flushed
pair by pair as labels arrive, so an interrupted run resumes where it stopped: pairs already in the file are not asked
again. Pairs the human qrels do not list count as not relevant (the BEIR convention: unjudged = irrelevant).

Agreement (``agreement``) over the pairs judged: Cohen's kappa, the judge's precision and recall against the human
labels, and nDCG@10 of the very same ranking scored with the judge's labels and with the human ones (mean over
queries, and how the two orders of the queries agree: Pearson r).
"""

from __future__ import annotations

import math
import re
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from rag.eval.beir import Qrels, ndcg_at
from rag.generation.hyde import Completer
from rag.generation.llm import GeneratorUnavailable

SYSTEM_PROMPT = ("You judge search results. Say Yes if the passage is relevant to the query: it answers the question, "
                 "or gives evidence for or against the claim. Otherwise say No. Answer with one word: Yes or No.")
JUDGE_REGEX = r"(Yes|No)"
MAX_PASSAGE_CHARS = 1200  # bounds the prefill (~300 tokens); the opening of a passage carries its topic
HEADER = "query-id\tcorpus-id\tscore"
_NEGATIVE = re.compile(r"\b(no|not relevant|irrelevant|false|unrelated)\b", re.I)
_POSITIVE = re.compile(r"\b(yes|relevant|true)\b", re.I)


def build_messages(query: str, title: str, text: str) -> list[dict]:
    """The chat messages asking whether the passage is relevant to the query."""
    passage = text if len(text) <= MAX_PASSAGE_CHARS else text[:MAX_PASSAGE_CHARS].rsplit(" ", 1)[0] + " ..."
    head = f"{title}\n" if title else ""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Query: {query}\n\nPassage: {head}{passage}\n\n"
                                        f"Is the passage relevant to the query? Yes or No."}]


def parse_label(reply: str) -> int | None:
    """1 (relevant), 0 (not), or None when the reply says neither. The earliest cue wins, and a negative cue
    ("not relevant", "no") is looked for before the positive word inside it."""
    negative, positive = _NEGATIVE.search(reply or ""), _POSITIVE.search(reply or "")
    if negative and (not positive or negative.start() <= positive.start()):
        return 0
    return 1 if positive else None


def read_judged(path: Path) -> dict[tuple[str, str], int]:
    """The labels already in a judge's out file (resuming); {} when it does not exist. Malformed lines (a run killed
    mid-write) are ignored, so those pairs are asked again."""
    judged: dict[tuple[str, str], int] = {}
    if not path.is_file():
        return judged
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2] in ("0", "1") and line != HEADER:
            judged[(parts[0], parts[1])] = int(parts[2])
    return judged


class YesNoClient:
    """Asks an OpenAI-compatible server (vLLM's) for one token with its top log-probabilities: the reply, and the
    margin log P(Yes) - log P(No) (case and leading-space variants pooled; None when neither is among the top).

    Why a margin and not the reply: SmolLM2-135M answers "No" (or "The passage is not relevant") to nearly every
    pair, relevant or not, yet gives "Yes" a visibly higher probability when the passage is on topic; a threshold on
    the margin keeps that signal (``Judge.threshold``)."""

    def __init__(self, base_url: str, model: str = "", *, timeout_s: float = 120.0, connect_timeout_s: float = 5.0,
                 top: int = 20) -> None:
        import httpx

        self.base_url, self.model, self.top = base_url.rstrip("/"), model, top
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s))

    def ask(self, messages: Sequence[dict]) -> tuple[str, float | None]:
        import httpx

        try:
            if not self.model:
                self.model = self.client.get(self.base_url + "/models").json()["data"][0]["id"]
            response = self.client.post(self.base_url + "/chat/completions", json={
                "model": self.model, "messages": list(messages), "max_tokens": 1, "temperature": 0.0,
                "logprobs": True, "top_logprobs": self.top})
            response.raise_for_status()
            choice = response.json()["choices"][0]
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise GeneratorUnavailable(f"{self.base_url}/chat/completions: {type(exc).__name__}: {exc}") from exc
        reply = choice["message"].get("content") or ""
        top = ((choice.get("logprobs") or {}).get("content") or [{}])[0].get("top_logprobs") or []
        return reply, yes_no_margin({t["token"]: t["logprob"] for t in top})

    def close(self) -> None:
        self.client.close()


def yes_no_margin(logprobs: Mapping[str, float]) -> float | None:
    """log P(yes) - log P(no) from one position's top log-probabilities, each side pooled over its spellings
    (``Yes``, `` yes``, ``YES``...); None when neither side is there."""
    def pooled(word: str) -> float | None:
        ps = [math.exp(lp) for tok, lp in logprobs.items() if tok.strip().lower() == word]
        return math.log(sum(ps)) if ps else None

    yes, no = pooled("yes"), pooled("no")
    if yes is None and no is None:
        return None
    floor = min(logprobs.values()) if logprobs else -30.0  # a side absent from the top is below its last entry
    return (yes if yes is not None else floor) - (no if no is not None else floor)


class CompleterAsker:
    """A ``Completer`` (the openai or vllm generator) as the judge's ``ask``: the reply held to Yes/No where the
    server has structured outputs, read by ``parse_label``; no margin."""

    def __init__(self, llm: Completer, timeout_s: float = 120.0) -> None:
        self.llm, self.timeout_s = llm, timeout_s

    def ask(self, messages: Sequence[dict]) -> tuple[str, float | None]:
        return self.llm.complete(messages, 4, self.timeout_s, regex=JUDGE_REGEX), None


class Judge:
    """Labels (query, passage) pairs with ``asker`` (``YesNoClient``, or ``CompleterAsker``), ``workers`` requests at
    once (the server batches them); appends each label to ``out`` as it arrives, and the reply and margin to
    ``out.margins.tsv`` beside it. A pair with a margin is relevant when the margin exceeds ``threshold``; without one
    its reply is parsed (``parse_label``).

    >>> judge = Judge(YesNoClient(url), Path("judged.tsv")); stats = judge.run(pairs, on_done=bar.advance)
    """

    def __init__(self, asker, out: Path, *, workers: int = 4, threshold: float = 0.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be greater than 0. Currently, the workers is {workers}")
        self.asker, self.out, self.workers, self.threshold = asker, Path(out), workers, threshold
        self.margins = self.out.with_name(self.out.name + ".margins.tsv")

    def label(self, query: str, title: str, text: str) -> tuple[int | None, str, float | None]:
        """(the label or None, the raw reply, the margin or None) for one pair; a model failure is a None label with
        the error as reply."""
        try:
            reply, margin = self.asker.ask(build_messages(query, title, text))
        except GeneratorUnavailable as exc:
            return None, f"error: {exc}", None
        if margin is not None:
            return int(margin > self.threshold), reply, margin
        return parse_label(reply), reply, None

    def run(self, pairs: Sequence[tuple[str, str, str, str, str]],
            on_done: Callable[[], None] | None = None) -> dict:
        """Judge ``pairs`` (qid, doc_id, query, title, text) not yet in the out file; returns counts (``asked``,
        ``resumed``, ``unparsed``, ``errors``) and ``unparsed_examples``."""
        done = read_judged(self.out)
        todo = [p for p in pairs if (p[0], p[1]) not in done]
        stats = {"pairs": len(pairs), "resumed": len(pairs) - len(todo), "asked": len(todo), "unparsed": 0,
                 "errors": 0, "unparsed_examples": [], "threshold": self.threshold}
        if on_done is not None:
            for _ in range(stats["resumed"]):
                on_done()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.out.is_file() or self.out.stat().st_size == 0
        with open(self.out, "a", encoding="utf-8") as fh, open(self.margins, "a", encoding="utf-8") as side, \
                ThreadPoolExecutor(self.workers) as pool:
            if fresh:
                fh.write(HEADER + "\n")
            elif not self.out.read_bytes().endswith(b"\n"):
                fh.write("\n")  # a line cut short by a kill mid-write: ignored by read_judged, never glued to the next
            futures = [(p, pool.submit(self.label, p[2], p[3], p[4])) for p in todo]
            for (qid, doc, *_), future in futures:
                label, reply, margin = future.result()
                if label is None:
                    stats["errors" if reply.startswith("error: ") else "unparsed"] += 1
                    if len(stats["unparsed_examples"]) < 5:
                        stats["unparsed_examples"].append(reply[:200])
                else:
                    side.write(f"{qid}\t{doc}\t{'' if margin is None else f'{margin:.4f}'}\t"
                               f"{' '.join(reply.split())[:80]}\n")
                    side.flush()
                    fh.write(f"{qid}\t{doc}\t{label}\n")
                    fh.flush()
                if on_done is not None:
                    on_done()
        return stats


def read_margins(path: Path) -> dict[tuple[str, str], float]:
    """The margins a judge wrote beside its qrels (``<out>.margins.tsv``), for choosing a threshold."""
    margins = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and parts[2]:
                try:
                    margins[(parts[0], parts[1])] = float(parts[2])
                except ValueError:
                    continue
    return margins


def cohen_kappa(a: Sequence[int], b: Sequence[int]) -> float:
    """Cohen's kappa of two binary labelings of the same items (nan when both are constant and equal: undefined)."""
    n = len(a)
    if n == 0 or len(b) != n:
        raise ValueError(f"cohen_kappa needs two labelings of the same items, got {len(a)} and {len(b)}")
    observed = sum(x == y for x, y in zip(a, b)) / n
    pa, pb = sum(a) / n, sum(b) / n
    expected = pa * pb + (1 - pa) * (1 - pb)
    return float("nan") if expected == 1 else (observed - expected) / (1 - expected)


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 2 or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return float("nan")
    return statistics.correlation(x, y)


def agreement(judged: Mapping[tuple[str, str], int], human: Qrels, ranked: Mapping[str, Sequence[str]],
              k: int = 10) -> dict:
    """The judge's labels against the human qrels over the judged pairs, and nDCG@k of ``ranked`` (the retrieval
    that was judged) from either set of labels."""
    pairs = sorted(judged)
    if not pairs:
        raise ValueError("no judged pair to compare with the human qrels")
    judge = [judged[p] for p in pairs]
    truth = [1 if human.get(q, {}).get(d, 0) > 0 else 0 for q, d in pairs]
    tp = sum(j and t for j, t in zip(judge, truth))
    judge_qrels: Qrels = {}
    for (q, d), label in judged.items():
        judge_qrels.setdefault(q, {})[d] = label
    queries = [q for q in ranked if q in judge_qrels]
    human_ndcg = [ndcg_at(ranked[q], human.get(q, {}), k) for q in queries]
    judge_ndcg = [ndcg_at(ranked[q], judge_qrels[q], k) for q in queries]
    return {"pairs": len(pairs), "queries": len(queries),
            "human_relevant": sum(truth), "judge_relevant": sum(judge),
            "agreement": sum(j == t for j, t in zip(judge, truth)) / len(pairs),
            "kappa": cohen_kappa(judge, truth),
            "precision": tp / sum(judge) if sum(judge) else float("nan"),
            "recall": tp / sum(truth) if sum(truth) else float("nan"),
            f"ndcg@{k}_human": statistics.fmean(human_ndcg) if queries else float("nan"),
            f"ndcg@{k}_judge": statistics.fmean(judge_ndcg) if queries else float("nan"),
            f"ndcg@{k}_pearson": _pearson(human_ndcg, judge_ndcg)}


def write_json_safe(report: dict) -> dict:
    """``report`` with NaN (undefined kappa, precision of a judge that said Yes to nothing) as None, for JSON."""
    def clean(v):
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return clean(report)


def retrieved_pairs(pipeline, queries: Mapping[str, str], retrievers: Iterable[str], top_k: int,
                    advance: Callable[[], None] | None = None) -> tuple[dict[str, list[str]], list[tuple]]:
    """Each query's top-``top_k`` documents as retrieved (ranked ids) and the pairs to judge: (qid, doc_id, query,
    title, the document's best-ranked chunk's text)."""
    ranked: dict[str, list[str]] = {}
    pairs: list[tuple] = []
    for qid, text in queries.items():
        fused = pipeline.retrieve(text, top_k * 3, list(retrievers), rerank=False, hyde=False)
        seen: dict[str, object] = {}
        for hit in fused.hits:
            chunk = pipeline.index.chunks[hit.chunk_id]
            seen.setdefault(chunk.doc_id, chunk)
        docs = list(seen.items())[:top_k]
        ranked[qid] = [doc for doc, _ in docs]
        pairs.extend((qid, doc, text, chunk.title, chunk.text) for doc, chunk in docs)
        if advance is not None:
            advance()
    return ranked, pairs
