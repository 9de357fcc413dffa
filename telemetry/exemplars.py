"""Exemplars across the workers of ``ragheat serve --workers N``.

prometheus_client keeps no exemplars in multiprocess mode (its shared files hold numbers only), so a worker's traced
observations would lose the trace ids that link a histogram bucket to a trace. Here each worker keeps the latest
exemplar per histogram bucket it observed (``ExemplarShare.record``, a dict update on the request path) and a
background thread writes them, when changed, to ``exemplars_<pid>.json`` in the multiprocess folder about once a
second (written aside, then renamed: a reader never sees half a file). Whichever worker answers a scrape attaches,
to each bucket sample of the summed histograms, the most recent exemplar any worker wrote for it
(``WithExemplars``). An exemplar is therefore up to ``interval_s`` late, never wrong: it names a real traced request
whose value fell in that bucket.

    share = ExemplarShare(folder)                                   # one per worker
    share.record("ragheat_request_duration_seconds", {"route": ...}, bounds, 0.012, trace_id)
    registry.register(WithExemplars(MultiProcessCollector(None, path=folder), folder))
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import time
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from prometheus_client.samples import Exemplar, Sample
from prometheus_client.utils import floatToGoString

PREFIX = "exemplars_"


def _key(sample_name: str, labels: Mapping[str, str]) -> str:
    return sample_name + json.dumps(sorted(labels.items()), separators=(",", ":"))


class ExemplarShare:
    """The latest exemplar per histogram bucket this worker observed, written to its file in ``folder``."""

    def __init__(self, folder: str | Path, interval_s: float = 1.0, pid: int | None = None) -> None:
        self.path = Path(folder) / f"{PREFIX}{pid or os.getpid()}.json"
        self.interval_s = interval_s
        self._latest: dict[str, list] = {}
        self._lock = threading.Lock()
        self._dirty = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ragheat-exemplars", daemon=True)
        self._thread.start()

    def record(self, family: str, labels: Mapping[str, str], upper_bounds: Sequence[float], value: float,
               trace_id: str) -> None:
        """``value`` observed in histogram ``family`` (base name, without ``_bucket``) with ``labels``, by the traced
        request ``trace_id``. ``upper_bounds``: the histogram's bucket bounds, ``+Inf`` last."""
        bound = upper_bounds[min(bisect.bisect_left(upper_bounds, value), len(upper_bounds) - 1)]
        key = _key(family + "_bucket", {**labels, "le": floatToGoString(bound)})
        with self._lock:
            self._latest[key] = [trace_id, value, time.time()]
            self._dirty = True

    def flush(self) -> None:
        """Write the file now if anything changed since the last write."""
        with self._lock:
            if not self._dirty:
                return
            snapshot, self._dirty = dict(self._latest), False
        aside = self.path.with_suffix(".tmp")
        aside.write_text(json.dumps(snapshot))
        os.replace(aside, self.path)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except OSError:  # the folder went away (the supervisor is stopping): nothing left to share with
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.flush()
        except OSError:
            pass


def read_exemplars(folder: str | Path) -> dict[str, Exemplar]:
    """The most recent exemplar per bucket sample key over every worker's file in ``folder``."""
    latest: dict[str, tuple[float, Exemplar]] = {}
    for path in Path(folder).glob(f"{PREFIX}*.json"):
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):  # removed meanwhile (a worker restarted)
            continue
        for key, (trace_id, value, at) in entries.items():
            if key not in latest or at > latest[key][0]:
                latest[key] = (at, Exemplar({"trace_id": trace_id}, value, at))
    return {key: exemplar for key, (_, exemplar) in latest.items()}


class WithExemplars:
    """A collector's families with the workers' exemplars attached to their histogram bucket samples."""

    def __init__(self, inner, folder: str | Path) -> None:
        self.inner, self.folder = inner, folder

    def collect(self) -> Iterable:
        exemplars = read_exemplars(self.folder)
        for family in self.inner.collect():
            if exemplars and family.type == "histogram":
                family.samples = [_with(sample, exemplars) for sample in family.samples]
            yield family


def _with(sample: Sample, exemplars: Mapping[str, Exemplar]) -> Sample:
    if not sample.name.endswith("_bucket"):
        return sample
    exemplar = exemplars.get(_key(sample.name, sample.labels))
    return sample if exemplar is None else sample._replace(exemplar=exemplar)
