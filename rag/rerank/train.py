"""``ragheat train-reranker``: fit the reranker's head on a BEIR split (torch; training only, never serving).

Data: for each judged query, the top ``candidates`` chunks of ragheat's own hybrid retrieval (its hard negatives:
what the served first stage ranks high but the qrels do not call relevant), their first-stage scores, and the raw
token states of the query (one embed run) and of every candidate chunk (``RawTokens``: encoded once, cacheable).

Model: the projection starts at the token states' top principal directions (a good untrained head) and is trained
jointly with the combination weights by a listwise softmax loss. The target distils the labels with the fused
retriever scores (``distill``: the share of the target given to the softmax of the fused score), so unjudged
candidates the retrievers agree on are not pushed down as hard as judged negatives would be.

Speed on two shared cores: MaxSim's gradient flows only through each query token's best document token, so every
epoch projects all candidate tokens once with the current projection (no gradient), picks the best tokens, and
back-propagates through those alone (the classic trick; exact at the start of each epoch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from rag.eval.beir import Qrels, ndcg_at
from rag.rerank.features import candidate_features
from rag.rerank.head import RerankHead
from rag.rerank.maxsim import maxsim
from rag.rerank.store import quantize_int8

RAW_TOKENS, RAW_OFFSETS = "raw_tokens.npy", "raw_offsets.npy"


@dataclass
class Example:
    """One judged query: its token states, the fused top candidates (chunk ids, their documents, first-stage
    features with MaxSim's column left 0, graded labels) and the documents ranked after them."""

    qid: str
    states: np.ndarray
    ids: np.ndarray
    docs: list[str]
    features: np.ndarray
    labels: np.ndarray
    tail_docs: list[str] = field(default_factory=list)


class RawTokens:
    """Raw (hidden-size) token states of an index's chunks: chunk i owns rows ``offsets[i]:offsets[i+1]`` (chunks
    that were not needed have none). Saved as two ``.npy`` files in a folder, memory-mapped when read."""

    def __init__(self, states: np.ndarray, offsets: np.ndarray) -> None:
        self.states, self.offsets = states, offsets

    def rows(self, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(row indices of the listed chunks' tokens, concatenated; where each chunk starts among them)."""
        begin, end = self.offsets[np.asarray(ids)], self.offsets[np.asarray(ids) + 1]
        if np.any(end <= begin):
            raise ValueError("raw token states are missing for some candidate chunks")
        rows = np.concatenate([np.arange(b, e) for b, e in zip(begin, end)])
        return rows, np.concatenate([[0], np.cumsum(end - begin)[:-1]]).astype(np.int64)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / RAW_TOKENS, self.states)
        np.save(folder / RAW_OFFSETS, self.offsets)

    @classmethod
    def load(cls, folder: Path, chunks: int) -> "RawTokens | None":
        """The cache in ``folder`` when it is there and covers ``chunks`` chunks, else None."""
        if not (folder / RAW_TOKENS).is_file() or not (folder / RAW_OFFSETS).is_file():
            return None
        offsets = np.load(folder / RAW_OFFSETS)
        return cls(np.load(folder / RAW_TOKENS, mmap_mode="r"), offsets) if len(offsets) == chunks + 1 else None

    @classmethod
    def encode(cls, embedder, texts: Sequence[str], needed: set[int], progress=None) -> "RawTokens":
        """Run the encoder over the ``needed`` chunks' texts (the same bulk session as ingest)."""
        order = sorted(needed)
        parts: dict[int, np.ndarray] = {}
        embedder.embed_many([texts[i] for i in order], progress=progress,
                            on_tokens=lambda j, states: parts.__setitem__(order[j], states.astype(np.float16)))
        lengths = np.array([len(parts[i]) if i in parts else 0 for i in range(len(texts))], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        states = np.concatenate([parts[i] for i in order]) if order else np.zeros((0, 1), np.float16)
        return cls(states, offsets)


def collect_examples(pipeline, queries: Mapping[str, str], qrels: Qrels, candidates: int = 50,
                     depth: int = 300, retrievers: Sequence[str] = ("dense", "bm25"),
                     advance: Callable[[], None] | None = None) -> list[Example]:
    """The first stage of every judged query, exactly as served (``FirstStageRecorder`` over
    ``RagPipeline.retrieve``): the hard negatives are what ragheat's own hybrid retrieval ranks high."""
    from rag.rerank.firststage import FirstStageRecorder

    chunks = pipeline.index.chunks
    examples = []
    with FirstStageRecorder(pipeline) as recorder:
        for qid, text in queries.items():
            if qid not in qrels:
                continue
            fused = pipeline.retrieve(text, depth, retrievers)
            query = recorder.take(text)
            top = fused.hits[:candidates]
            docs = [chunks[h.chunk_id].doc_id for h in top]
            features = candidate_features(np.zeros(len(top), np.float32), top, query.first_stage)
            labels = np.array([qrels[qid].get(d, 0) for d in docs], np.float32)
            examples.append(Example(qid, np.asarray(query.token_states, np.float32),
                                    np.array([h.chunk_id for h in top], np.int64), docs, features, labels,
                                    [chunks[h.chunk_id].doc_id for h in fused.hits[candidates:]]))
            if advance:
                advance()
    return examples


def _normalise(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def pca_projection(raw: RawTokens, ids: Sequence[int], dim: int, seed: int, sample: int = 200_000) -> np.ndarray:
    """The top ``dim`` principal directions (uncentred) of the candidates' token states: an untrained head that
    keeps most of MaxSim's full-width geometry."""
    rows, _ = raw.rows(sorted(set(int(i) for i in ids)))
    rng = np.random.default_rng(seed)
    if len(rows) > sample:
        rows = np.sort(rng.choice(rows, sample, replace=False))
    x = np.asarray(raw.states[rows], np.float32)
    _, vectors = np.linalg.eigh(x.T @ x)
    return np.ascontiguousarray(vectors[:, ::-1][:, :dim]).astype(np.float32)


def score_examples(head: RerankHead, examples: Sequence[Example], raw: RawTokens, dtype: str = "fp16") -> list[np.ndarray]:
    """The head's scores of each example's candidates, with the document side stored as ``dtype`` the way an
    index stores it (numpy only: the serving arithmetic)."""
    out = []
    for ex in examples:
        rows, starts = raw.rows(ex.ids)
        docs = head.project(np.asarray(raw.states[rows], np.float32))
        if dtype == "int8":
            codes, scales = quantize_int8(docs)
            docs = codes.astype(np.float32) * scales[:, None]
        else:
            docs = docs.astype(np.float16).astype(np.float32)
        features = ex.features.copy()
        features[:, 0] = maxsim(head.project(ex.states), docs, starts)
        out.append(head.combine(features))
    return out


def ndcg_table(examples: Sequence[Example], qrels: Qrels, scores: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """nDCG@10 per example of the fused order (``scores`` None) or of the candidates reordered by ``scores``
    followed by the documents ranked after them (as ``LateInteractionReranker`` does)."""
    values = []
    for i, ex in enumerate(examples):
        order = range(len(ex.docs)) if scores is None else np.argsort(-scores[i], kind="stable")
        ranked = list(dict.fromkeys([ex.docs[j] for j in order] + ex.tail_docs))
        values.append(ndcg_at(ranked, qrels[ex.qid], 10))
    return np.array(values)


def fit_head(examples: Sequence[Example], raw: RawTokens, *, dim: int = 128, epochs: int = 6, lr: float = 2e-3,
             distill: float = 0.1, batch: int = 16, seed: int = 0, train_projection: bool = True,
             log: Callable[[str], None] | None = None) -> RerankHead:
    """Train a head on ``examples`` (queries with no relevant candidate teach the listwise loss nothing and are
    left out). Deterministic for a seed on one machine."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    usable = [ex for ex in examples if ex.labels.max() > 0]
    if not usable:
        raise ValueError("no training query has a relevant document among its candidates")
    union = sorted({int(i) for ex in usable for i in ex.ids})
    projection = pca_projection(raw, union, dim, seed)
    # The union of candidate tokens, once (fp16), and each example's rows in it.
    union_rows, _ = raw.rows(union)
    tokens = np.asarray(raw.states[union_rows], np.float16)
    lengths_u = raw.offsets[np.array(union) + 1] - raw.offsets[np.array(union)]
    first = dict(zip(union, np.concatenate([[0], np.cumsum(lengths_u)[:-1]])))
    spans = {}
    for ex in usable:
        begin = np.array([first[int(i)] for i in ex.ids])
        lengths = raw.offsets[ex.ids + 1] - raw.offsets[ex.ids]
        spans[ex.qid] = (np.concatenate([np.arange(b, b + n) for b, n in zip(begin, lengths)]),
                         np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))

    def project_all(matrix: np.ndarray) -> np.ndarray:
        out = np.empty((len(tokens), dim), np.float16)
        for a in range(0, len(tokens), 65536):
            out[a:a + 65536] = _normalise(tokens[a:a + 65536].astype(np.float32) @ matrix)
        return out

    # Feature scaling from the untrained head's MaxSim; folded into the learned weights, so it only conditions.
    projected = project_all(projection)
    features = {}
    for ex in usable:
        rows, starts = spans[ex.qid]
        f = ex.features.copy()
        f[:, 0] = maxsim(_normalise(ex.states @ projection), projected[rows].astype(np.float32), starts)
        features[ex.qid] = f
    stacked = np.concatenate(list(features.values()))
    mean, std = stacked.mean(axis=0), np.maximum(stacked.std(axis=0), 1e-6)

    w_proj = torch.nn.Parameter(torch.from_numpy(projection.copy()))
    w_comb = torch.nn.Parameter(torch.tensor([1.0, 1.0, 0.5, 0.5]))
    params = [w_comb] + ([w_proj] if train_projection else [])
    optimiser = torch.optim.Adam(params, lr=lr)
    mean_t, std_t = torch.from_numpy(mean.astype(np.float32)), torch.from_numpy(std.astype(np.float32))
    for epoch in range(epochs):
        if epoch and train_projection:  # by this epoch's head, to pick each query token's best document token
            projected = project_all(w_proj.detach().numpy())
        order = rng.permutation(len(usable))
        total = 0.0
        for start in range(0, len(order), batch):
            optimiser.zero_grad()
            loss = torch.zeros(())
            for idx in order[start:start + batch]:
                ex = usable[idx]
                rows, starts = spans[ex.qid]
                q = torch.nn.functional.normalize(torch.from_numpy(ex.states) @ w_proj, dim=-1)  # (Tq, dim)
                sims = q.detach().numpy() @ projected[rows].astype(np.float32).T  # (Tq, tokens)
                bounds = np.append(starts, sims.shape[1])
                picks = np.stack([rows[bounds[j] + sims[:, bounds[j]:bounds[j + 1]].argmax(axis=1)]
                                  for j in range(len(starts))])  # (n, Tq) rows of ``tokens``
                chosen = torch.from_numpy(tokens[picks.reshape(-1)].astype(np.float32)) @ w_proj
                chosen = torch.nn.functional.normalize(chosen, dim=-1).reshape(len(starts), q.shape[0], -1)
                ms = (chosen * q.unsqueeze(0)).sum(-1).mean(-1)  # (n,)
                feats = torch.from_numpy(ex.features).clone()
                feats[:, 0] = ms
                logits = ((feats - mean_t) / std_t) @ w_comb
                labels = torch.from_numpy(ex.labels)
                target = labels / labels.sum()
                if distill > 0:
                    fused = (torch.from_numpy(ex.features[:, 1]) - mean_t[1]) / std_t[1]
                    target = (1 - distill) * target + distill * torch.softmax(fused, 0)
                loss = loss - (target * torch.log_softmax(logits, 0)).sum()
            loss = loss / len(order[start:start + batch])
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(order[start:start + batch])
        if log:
            log(f"epoch {epoch + 1}/{epochs}: loss {total / len(usable):.4f}")
    return RerankHead(w_proj.detach().numpy().astype(np.float32), w_comb.detach().numpy().astype(np.float32),
                      0.0, mean.astype(np.float32), std.astype(np.float32),
                      {"dim": dim, "epochs": epochs, "lr": lr, "distill": distill, "batch": batch, "seed": seed,
                       "train_projection": train_projection, "queries": len(usable)})


def cross_validate(examples: Sequence[Example], raw: RawTokens, qrels: Qrels, folds: int = 5, seed: int = 0,
                   dtype: str = "fp16", log: Callable[[str], None] | None = None, **fit) -> dict:
    """``folds``-fold cross-validation over the queries: train on the others, score the held-out fold. Per fold
    and overall: nDCG@10 of the fused order and of the reranked one."""
    rng = np.random.default_rng(seed)
    assignment = rng.permutation(len(examples)) % folds
    report = {"folds": [], "seed": seed, "dtype": dtype, "fit": fit}
    for fold in range(folds):
        train = [ex for ex, f in zip(examples, assignment) if f != fold]
        held = [ex for ex, f in zip(examples, assignment) if f == fold]
        head = fit_head(train, raw, seed=seed, log=log, **fit)
        base, reranked = ndcg_table(held, qrels), ndcg_table(held, qrels, score_examples(head, held, raw, dtype))
        report["folds"].append({"fold": fold, "queries": len(held), "hybrid": float(base.mean()),
                                "rerank": float(reranked.mean()), "weights": head.weights.tolist()})
        if log:
            log(f"fold {fold}: hybrid {base.mean():.4f} -> rerank {reranked.mean():.4f} ({len(held)} queries)")
    gains = np.array([f["rerank"] - f["hybrid"] for f in report["folds"]])
    report["summary"] = {"hybrid": float(np.mean([f["hybrid"] for f in report["folds"]])),
                         "rerank": float(np.mean([f["rerank"] for f in report["folds"]])),
                         "rerank_std": float(np.std([f["rerank"] for f in report["folds"]])),
                         "gain_min": float(gains.min()), "gain_mean": float(gains.mean())}
    return report


def save_report(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True))
