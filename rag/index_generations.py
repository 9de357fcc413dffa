"""Serving one index generation while the next is loaded beside it: the hot swap.

``ragheat ingest`` publishes a new generation by swapping the index folder's ``current`` link (``rag.index.store``).
``IndexGenerationSwitch`` notices (a poll of that link every ``server.reload_poll_s``, or ``reload()`` from
``POST /admin/reload``), builds a whole new ``RagPipeline`` over it and warms it up while the old one keeps serving,
then swaps them with one reference assignment. Each request holds a ``Lease`` on the generation it started on, read
once when it arrives, so requests in flight finish on the old generation; the old pipeline is closed (its graph store
stopped, its index and model freed) when its last lease is released. A generation that fails to load is never
swapped in: the old one keeps serving, and the failure is logged, counted and shown by ``/readyz``.

    switch = IndexGenerationSwitch(RagPipeline(settings, index_dir)); switch.warm_up(); switch.watch(2.0)
    with switch.lease() as lease:
        lease.pipeline.query("what causes tides?", 5)

What belongs to one generation lives in its pipeline (index, embedder, graph store, router, and any per-generation
cache), so it is swapped with it; the language model (a client, or the in-process engine holding the accelerator) is
handed from each pipeline to the next. Something shared between generations (an answer cache kept outside the
pipeline, say) registers an ``on_swap`` hook to be emptied, or keys its entries by generation: old requests may still
finish, and write, after the swap.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rag.errors import RagheatError
from rag.index.store import CURRENT, read_manifest
from rag.pipeline import RagPipeline

log = logging.getLogger("ragheat.generations")

LOADING_SWITCH_INTERVAL_S = 0.0005
"""The interpreter's switch interval (``sys.setswitchinterval``) while a successor loads beside the served generation.
The load's Python work (BM25's vocabulary, the manifests and settings, a generation's chunks without a recorded
digest) keeps the GIL a whole interval at a time, and a request that released it for a numpy or ONNX Runtime call
waits up to one interval to get it back, at every such call: with CPython's default, a request served during a large
load is many times slower."""


class ReloadError(RagheatError):
    """A newer generation could not be loaded; the one served before still is."""


@dataclass(frozen=True)
class ReloadOutcome:
    """What ``IndexGenerationSwitch.reload()`` did; ``previous`` is the generation served before the call."""

    outcome: str
    generation: str
    previous: str


class _Served:
    """One generation being served, with the requests holding it."""

    __slots__ = ("pipeline", "generation", "leases", "retired")

    def __init__(self, pipeline: RagPipeline) -> None:
        self.pipeline, self.generation = pipeline, pipeline.describe().generation
        self.leases, self.retired = 0, False


class Lease:
    """A request's hold on the generation it started on; ``release()`` (or the end of a ``with``) lets it go."""

    __slots__ = ("_served", "_switch", "_released")

    def __init__(self, switch: "IndexGenerationSwitch", served: _Served) -> None:
        self._switch, self._served, self._released = switch, served, False

    @property
    def pipeline(self) -> RagPipeline:
        return self._served.pipeline

    @property
    def generation(self) -> str:
        return self._served.generation

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._switch._release(self._served)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class IndexGenerationSwitch:
    """Holds the served pipeline and swaps in newer generations of its index folder (see the module docstring).

    ``on_swap(old, new)`` hooks run right after a swap; ``on_reload(outcome)`` hooks after every reload attempt
    (telemetry counts them). Neither may raise into the switch: a failing hook is logged."""

    def __init__(self, pipeline: RagPipeline) -> None:
        self.index_dir = Path(pipeline.index_dir)
        self._initial: RagPipeline | None = pipeline
        self._served: _Served | None = None
        self._lock = threading.Lock()  # guards _served and every lease count: taking a lease and swapping are atomic
        self._reload_lock = threading.Lock()  # one reload at a time
        self.on_swap: list[Callable[[RagPipeline, RagPipeline], None]] = []
        self.on_reload: list[Callable[[str], None]] = []
        self.last_error: str | None = None
        self.swaps = 0
        self.collections = 0  # heap-wide collections a retirement needed (a generation kept by a reference cycle)
        self._watcher: threading.Thread | None = None
        self._stop = threading.Event()

    # -- serving ----------------------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Load the first generation (``IndexLoadError`` naming the path if it cannot be)."""
        if self._served is not None:
            return
        self._initial.warm_up()
        self._served = _Served(self._initial)
        self._initial = None

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._served_locked() is not None

    def _served_locked(self) -> "_Served | None":
        """The served generation (call with ``_lock`` held). A first pipeline that its owner warmed up directly, not
        through ``warm_up()`` (an embedding host, a test), is adopted as served the moment it is ready."""
        if self._served is None and self._initial is not None and self._initial.ready:
            self._served, self._initial = _Served(self._initial), None
        return self._served

    @property
    def current(self) -> RagPipeline:
        """The pipeline new requests get (before warm-up: the one that will be warmed up)."""
        served = self._served
        return served.pipeline if served is not None else self._initial

    @property
    def generation(self) -> str | None:
        served = self._served
        return None if served is None else served.generation

    def lease(self) -> Lease | None:
        """A hold on the generation served now, for one request; None before ``warm_up()``."""
        with self._lock:
            served = self._served_locked()
            if served is None:
                return None
            served.leases += 1
        return Lease(self, served)

    def _release(self, served: _Served) -> None:
        with self._lock:
            served.leases -= 1
            last = served.retired and served.leases == 0
        if last:
            self._retire(served)

    # -- swapping ---------------------------------------------------------------------------------------------
    def reload(self) -> ReloadOutcome:
        """Serve the generation ``current`` points at now, if it is not the one served: load it beside the served
        one, then swap. ``ReloadError`` (the old generation still served) when it cannot be loaded."""
        with self._reload_lock:
            served = self._served
            if served is None:
                raise ReloadError("the service is still loading its first generation")
            try:
                on_disk = read_manifest(self.index_dir)["generation"]
            except RagheatError as exc:
                raise self._failed(served, str(exc)) from exc
            if on_disk == served.generation:
                self.last_error = None
                return self._reloaded(ReloadOutcome("unchanged", served.generation, served.generation))
            started = time.perf_counter()
            successor = self._successor(served.pipeline)
            try:
                with _switch_interval(LOADING_SWITCH_INTERVAL_S):
                    successor.warm_up()
            except Exception as exc:  # IndexLoadError, a model mismatch, a graph store that will not start
                self._discard(successor, served.pipeline)
                raise self._failed(served, f"generation {on_disk} cannot be served: {exc}") from exc
            new = _Served(successor)
            with self._lock:
                self._served = new  # the swap: requests arriving from here on lease the new generation
                served.retired = True
                last = served.leases == 0
            self.swaps += 1
            self.last_error = None
            log.info("serving generation %s (was %s; loaded beside it in %.1f s)", new.generation, served.generation,
                     time.perf_counter() - started)
            for hook in self.on_swap:
                _call(hook, served.pipeline, successor)
            if last:
                self._retire(served)
            return self._reloaded(ReloadOutcome("swapped", new.generation, served.generation))

    def _successor(self, previous: RagPipeline) -> RagPipeline:
        pipeline = RagPipeline(previous.settings, previous.index_dir)
        # One language model for every generation: the in-process engine holds the accelerator's memory, and a
        # client's connections do not depend on the index. warm_up() keeps an llm that is already set.
        pipeline.llm = previous.llm
        return pipeline

    def _failed(self, served: _Served, reason: str) -> ReloadError:
        self.last_error = reason
        log.error("index reload failed; still serving generation %s: %s", served.generation, reason)
        self._reloaded(ReloadOutcome("failed", served.generation, served.generation))
        return ReloadError(f"{reason}; still serving generation {served.generation}")

    def _reloaded(self, outcome: ReloadOutcome) -> ReloadOutcome:
        for hook in self.on_reload:
            _call(hook, outcome.outcome)
        return outcome

    def _retire(self, served: _Served) -> None:
        """Close a swapped-out generation once nothing uses it, off the request path: closing stops its graph store,
        and the collection below scans the whole heap."""
        threading.Thread(target=self._close_retired, args=(served,), name="ragheat-retire", daemon=True).start()

    def _close_retired(self, served: _Served) -> None:
        keep = self._served.pipeline if self._served is not None else None
        self._discard(served.pipeline, keep)
        retired = weakref.ref(served.pipeline)
        served.pipeline = None  # the last reference the switch held
        frozen = gc.get_freeze_count() > 0
        if retired() is not None:
            # Something still holds the old generation: a reference cycle. The service froze its generations out
            # of the collector's reach (gc.freeze after warm-up), so it would stay allocated for good: unfreeze,
            # collect, and freeze what is left. The collection walks the whole heap in one call, holding the GIL
            # while requests wait, so it runs only when it has something to free.
            self.collections += 1
            if frozen:
                gc.unfreeze()
            gc.collect()
        elif frozen:
            gc.collect(1)  # the young garbage, not to be frozen with the new generation
        if frozen:
            gc.freeze()  # the new generation out of the collector's reach, as the first one
        log.info("generation %s released", served.generation)

    @staticmethod
    def _discard(pipeline: RagPipeline, keep: RagPipeline | None) -> None:
        if keep is not None and pipeline.llm is not None and pipeline.llm is keep.llm:
            pipeline.llm = None  # shared with the generation that stays: not this one's to close
        try:
            pipeline.close()
        except Exception:
            log.exception("closing a retired generation failed")

    # -- watching ---------------------------------------------------------------------------------------------
    def watch(self, interval_s: float) -> None:
        """Reload whenever the index folder's ``current`` link changes, checked every ``interval_s`` (a readlink)."""
        if interval_s <= 0 or self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, args=(interval_s,), name="ragheat-reload", daemon=True)
        self._watcher.start()

    def _watch(self, interval_s: float) -> None:
        link = self.index_dir / CURRENT
        seen = _readlink(link)
        while not self._stop.wait(interval_s):
            target = _readlink(link)
            if target is None or target == seen:
                continue
            seen = target  # a generation that fails to load is not retried until current changes again
            try:
                self.reload()
            except ReloadError:
                pass  # logged and counted by reload(); the old generation keeps serving
            except Exception:
                log.exception("index reload failed")

    def close(self) -> None:
        """Stop watching and close every generation still open (in-flight requests have ended by now)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        with self._reload_lock:
            served, self._served = self._served, None
        if served is not None:
            served.pipeline.close()
        elif self._initial is not None:
            self._initial.close()


def _readlink(link: Path) -> str | None:
    try:
        return os.readlink(link)
    except OSError:  # no link: the index folder is a single generation, nothing to watch
        return None


def _call(hook, *args) -> None:
    try:
        hook(*args)
    except Exception:
        log.exception("a generation hook failed")


_interval_lock = threading.Lock()
_interval_users = 0
_interval_before = 0.0


@contextmanager
def _switch_interval(seconds: float):
    """The interpreter's switch interval at most ``seconds`` for the block, then as it was when the first of the
    blocks running at once began (the setting is process-wide: two switches may load at once)."""
    global _interval_users, _interval_before
    with _interval_lock:
        if _interval_users == 0:
            _interval_before = sys.getswitchinterval()
        _interval_users += 1
        sys.setswitchinterval(min(_interval_before, seconds))
    try:
        yield
    finally:
        with _interval_lock:
            _interval_users -= 1
            if _interval_users == 0:
                sys.setswitchinterval(_interval_before)
