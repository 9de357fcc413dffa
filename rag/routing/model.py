"""The router's model: a multinomial logistic regression over standardised features, one class per arm, in numpy
(serving needs nothing else). Saved as one small ``.npz`` (no pickles): weights, feature mean and scale, the arm and
feature names it was trained with (checked when loaded), and what trained it (command, data, seed, figures)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from rag.errors import IndexLoadError

MODEL_FORMAT = 1


@dataclass
class RouterModel:
    """Scores = ((x - mean) / scale) @ W + b; the route is the arm with the highest score."""

    arms: tuple[str, ...]
    features: tuple[str, ...]
    mean: np.ndarray
    scale: np.ndarray
    W: np.ndarray  # (features, arms)
    b: np.ndarray  # (arms,)
    metadata: dict = field(default_factory=dict)

    def scores(self, X: np.ndarray) -> np.ndarray:
        return ((np.atleast_2d(X) - self.mean) / self.scale) @ self.W + self.b

    def predict(self, X: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
        """The best arm per row; ``allowed`` (a boolean per arm) masks arms that cannot run here."""
        scores = self.scores(X)
        if allowed is not None:
            scores = np.where(allowed[None, :], scores, -np.inf)
        return np.argmax(scores, axis=1)

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:  # np.savez on a path would append .npz to any other suffix
            np.savez(fh, format=np.int64(MODEL_FORMAT), arms=np.array(self.arms), features=np.array(self.features),
                     mean=self.mean, scale=self.scale, W=self.W, b=self.b,
                     metadata=np.array(json.dumps(self.metadata, sort_keys=True)))

    @classmethod
    def load(cls, path: Path, *, arms: Sequence[str], features: Sequence[str]) -> "RouterModel":
        """The model at ``path``; ``IndexLoadError`` naming it when it is unreadable or was trained for other arms
        or features than this code has."""
        try:
            with np.load(path, allow_pickle=False) as z:
                model = cls(tuple(str(a) for a in z["arms"]), tuple(str(f) for f in z["features"]),
                            z["mean"].astype(np.float64), z["scale"].astype(np.float64), z["W"].astype(np.float64),
                            z["b"].astype(np.float64), json.loads(str(z["metadata"])))
                version = int(z["format"])
        except (OSError, KeyError, ValueError) as exc:
            raise IndexLoadError(path, f"the router model is unreadable ({exc})") from exc
        if version != MODEL_FORMAT:
            raise IndexLoadError(path, f"router model format {version} is not {MODEL_FORMAT}; retrain it "
                                       "(`ragheat train-router`)")
        if model.features != tuple(features) or not set(model.arms) <= set(arms):
            raise IndexLoadError(path, "the router model was trained for other features or routes than this version "
                                       "has; retrain it (`ragheat train-router`)")
        if model.W.shape != (len(model.features), len(model.arms)):
            raise IndexLoadError(path, f"the router model's weights have shape {model.W.shape}")
        return model


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def fit_logistic(X: np.ndarray, labels: np.ndarray, sample_weight: np.ndarray, arms: Sequence[str],
                 features: Sequence[str], *, l2: float = 1.0, steps: int = 300, lr: float = 0.05) -> RouterModel:
    """Weighted multinomial logistic regression by full-batch Adam from zero weights: deterministic (the same
    data gives the same bytes). ``sample_weight`` says how much each query's choice matters."""
    X = np.asarray(X, np.float64)
    mean = X.mean(axis=0)
    scale = X.std(axis=0) + 1e-6
    Z = (X - mean) / scale
    n, d = Z.shape
    k = len(arms)
    Y = np.zeros((n, k))
    Y[np.arange(n), labels] = 1.0
    sw = np.asarray(sample_weight, np.float64)
    sw = sw / max(sw.sum(), 1e-12)
    W, b = np.zeros((d, k)), np.zeros(k)
    mW, vW, mb, vb = np.zeros_like(W), np.zeros_like(W), np.zeros_like(b), np.zeros_like(b)
    for t in range(1, steps + 1):
        G = (_softmax(Z @ W + b) - Y) * sw[:, None]
        gW, gb = Z.T @ G + l2 * W / n, G.sum(axis=0)
        for g, m, v, p in ((gW, mW, vW, W), (gb, mb, vb, b)):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            p -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return RouterModel(tuple(arms), tuple(features), mean, scale, W, b)


def best_arm_labels(ndcg: np.ndarray, costs: np.ndarray, tie: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Per query (rows of ``ndcg[query, arm]``): the label = its best arm, ties going to the cheapest (``costs``:
    retrievers an arm runs), and the weight = best - worst nDCG (a query where every arm ties teaches nothing)."""
    best = ndcg.max(axis=1, keepdims=True)
    label = np.argmax((ndcg >= best - tie) * 1.0 - costs * 1e-3, axis=1)
    return label, ndcg.max(axis=1) - ndcg.min(axis=1)
