"""The reranker's trained head: a (hidden x dim) projection of token states and a linear combination of the
MaxSim score with the first-stage scores. Stored as a ``.npz`` (the weights, with the command, data and seed that
trained them) and the projection exported to ONNX beside it (``.onnx``, run on ONNX Runtime: ``onnx_head``), so
serving never imports torch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from rag.errors import ConfigurationError

FEATURES = ("maxsim", "fused", "dense", "bm25")
"""What the final score combines, per candidate: MaxSim (mean over query tokens of the best document token), the
fused (RRF) score over the list's best, the dense cosine, and the BM25 score over the list's best (``features``)."""
DEFAULT_HEAD = Path(__file__).parent / "heads" / "minilm-l6-scifact-128.npz"
"""The head that ships: trained on SciFact train claims (see its ``meta`` for command, data and seed)."""


@dataclass(frozen=True)
class RerankHead:
    """Projection plus combination. ``project`` turns token states (tokens, hidden) into unit vectors (tokens,
    dim); ``combine`` turns a (candidates, len(FEATURES)) feature matrix into final scores.

    >>> head = RerankHead.load(DEFAULT_HEAD)
    >>> head.project(np.zeros((3, 384), np.float32)).shape
    (3, 128)
    """

    projection: np.ndarray  # (hidden, dim) float32
    weights: np.ndarray  # (len(FEATURES),) applied to standardised features
    bias: float = 0.0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURES), np.float32))
    std: np.ndarray = field(default_factory=lambda: np.ones(len(FEATURES), np.float32))
    meta: dict = field(default_factory=dict)
    source: Path | None = field(default=None, compare=False)  # the .npz it was loaded from (its .onnx is beside it)

    def __post_init__(self) -> None:
        if self.projection.ndim != 2 or self.weights.shape != (len(FEATURES),):
            raise ValueError(f"a rerank head needs a 2-D projection and {len(FEATURES)} weights, got "
                             f"{self.projection.shape} and {self.weights.shape}")

    @property
    def hidden(self) -> int:
        return int(self.projection.shape[0])

    @property
    def dim(self) -> int:
        return int(self.projection.shape[1])

    @property
    def projection_sha256(self) -> str:
        """What stored token vectors were projected with: an index records it, so another head is never paired
        with them (the combination weights may change freely)."""
        return hashlib.sha256(np.ascontiguousarray(self.projection, np.float32).tobytes()).hexdigest()

    def project(self, states: np.ndarray) -> np.ndarray:
        """Token states (tokens, hidden) -> unit vectors (tokens, dim), through the exported ONNX graph."""
        return self._onnx(states)

    def to_onnx(self):
        """The projection as an ONNX model (``onnx_head.export``), this head's digest and provenance in it."""
        from rag.rerank import onnx_head

        return onnx_head.export(self.projection, self.projection_sha256,
                                {"meta": json.dumps(self.meta, sort_keys=True)})

    @cached_property
    def _onnx(self):
        """The session: from the .onnx shipped beside the .npz when there is one (checked against this projection),
        else exported now (a head built in memory, as training does, or a .npz with no .onnx beside it)."""
        from rag.rerank import onnx_head

        exported = self.source.with_suffix(".onnx") if self.source is not None else None
        if exported is not None and exported.is_file():
            return onnx_head.load(exported, self.projection_sha256)
        return onnx_head.OnnxProjection(self.to_onnx())

    def combine(self, features: np.ndarray) -> np.ndarray:
        return ((features - self.mean) / self.std) @ self.weights + self.bias

    def save(self, path: Path) -> Path:
        """The weights to ``path`` (.npz) and the exported projection beside it (same name, ``.onnx``)."""
        import onnx

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:  # np.savez would append .npz to a name without it
            np.savez(fh, projection=self.projection.astype(np.float32), weights=self.weights.astype(np.float32),
                     bias=np.float32(self.bias), mean=self.mean.astype(np.float32), std=self.std.astype(np.float32),
                     features=np.array(FEATURES), meta=np.array(json.dumps(self.meta, sort_keys=True)))
        onnx.save(self.to_onnx(), str(path.with_suffix(".onnx")))
        return path

    @classmethod
    def load(cls, path: Path) -> "RerankHead":
        """``ConfigurationError`` naming the file when it is missing or not a head of this feature set."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                features = tuple(str(f) for f in z["features"])
                if features != FEATURES:
                    raise ConfigurationError(f"rerank head {path}: features {features} are not {FEATURES}; "
                                             f"retrain it with `ragheat train-reranker`")
                return cls(z["projection"].astype(np.float32), z["weights"].astype(np.float32), float(z["bias"]),
                           z["mean"].astype(np.float32), z["std"].astype(np.float32), json.loads(str(z["meta"])),
                           source=path)
        except ConfigurationError:
            raise
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigurationError(f"rerank head {path} cannot be read ({type(exc).__name__}: {exc})") from exc
