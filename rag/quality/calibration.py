"""The calibration that turns the best-similarity signal into the ``no_good_passage`` verdict, and the reference the
live signals drift from.

``ragheat calibrate-quality`` runs the served pipeline over training queries (the corpus's own questions) and keeps,
per signal, the quantiles of what those queries scored. The threshold is the best similarity's ``flag_rate``
quantile: on traffic like the training queries about that share of answers is flagged, so an objective of
``1 - flag_rate`` and more leaves the rest of the error budget for what goes wrong. The shipped calibration
(``DEFAULT_CALIBRATION``) was measured on both training sets in the repository with the shipped query encoder; a
corpus or encoder of your own deserves its own (``quality.calibration``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from rag.stages import QUALITY_SIGNALS

DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.json")
REFERENCE_QUANTILES = (0.02, 0.05, 0.1, 0.25, 0.5)
"""Quantiles of each signal kept as the reference (the low tail is where quality is lost)."""
DEFAULT_FLAG_RATE = 0.02


class CalibrationError(ValueError):
    """A calibration file that cannot be used, with the path and what is wrong."""


@dataclass(frozen=True)
class Calibration:
    """``min_similarity``: the best similarity below which an answer has no good passage; ``reference``: signal ->
    {quantile: value} over the training queries; ``flag_rate``: the share of them the threshold flags; ``sources``:
    what it was measured on (sets, query counts, the encoder)."""

    min_similarity: float
    flag_rate: float
    reference: dict[str, dict[str, float]] = field(default_factory=dict)
    sources: list[dict] = field(default_factory=list)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path | None = None) -> "Calibration":
        path = path or DEFAULT_CALIBRATION
        try:
            data = json.loads(path.read_text())
            calibration = cls(float(data["min_similarity"]), float(data["flag_rate"]), data.get("reference", {}),
                              data.get("sources", []))
        except FileNotFoundError:
            raise CalibrationError(f"quality.calibration: {path} does not exist (write one with "
                                   f"`ragheat calibrate-quality`)") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CalibrationError(f"quality.calibration: {path} is not a calibration ({exc})") from None
        if not -1.0 <= calibration.min_similarity <= 1.0 or not 0.0 < calibration.flag_rate < 1.0:
            raise CalibrationError(f"quality.calibration: {path}: min_similarity must lie in -1..1 and flag_rate in "
                                   f"0..1, got {calibration.min_similarity} and {calibration.flag_rate}")
        return calibration


def calibrate(signals: Mapping[str, Sequence[float]], flag_rate: float = DEFAULT_FLAG_RATE,
              sources: Sequence[dict] = ()) -> Calibration:
    """A calibration from the training queries' signals (signal -> values; ``best_similarity`` required)."""
    if not 0.0 < flag_rate < 1.0:
        raise ValueError(f"flag_rate must lie strictly between 0 and 1, got {flag_rate}")
    similarity = np.asarray([v for v in signals.get("best_similarity", ()) if not math.isnan(v)], np.float64)
    if similarity.size < 20:
        raise ValueError(f"calibrating needs the best similarity of at least 20 queries, got {similarity.size}")
    reference = {}
    for name in QUALITY_SIGNALS:
        values = np.asarray([v for v in signals.get(name, ()) if not math.isnan(v)], np.float64)
        if values.size:
            reference[name] = {f"{q:g}": round(float(np.quantile(values, q)), 4) for q in REFERENCE_QUANTILES}
    return Calibration(round(float(np.quantile(similarity, flag_rate)), 4), flag_rate, reference, list(sources))

