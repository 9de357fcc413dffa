"""The hot swap's manners toward the requests it serves meanwhile (rag/index_generations.py): the successor loads
with short interpreter switch slices, and a retired generation freed as it is dropped costs no heap-wide collection.
The swap itself, end to end over HTTP: tests/rag/api/test_hot_swap.py."""

from __future__ import annotations

import gc
import sys
import time
import weakref
from types import SimpleNamespace

import pytest

import rag.index_generations as generations
from rag.index.store import IndexWriter, read_manifest
from rag.index_generations import LOADING_SWITCH_INTERVAL_S, IndexGenerationSwitch


class Pipeline:
    """What the switch asks of a pipeline, over an index folder whose manifests hold nothing else."""

    seen_switch_interval: list[float] = []

    def __init__(self, settings, index_dir) -> None:
        self.settings, self.index_dir, self.llm, self.ready = settings, index_dir, None, False
        self.generation = None

    def warm_up(self) -> None:
        Pipeline.seen_switch_interval.append(sys.getswitchinterval())
        self.generation, self.ready = read_manifest(self.index_dir)["generation"], True

    def describe(self):
        return SimpleNamespace(generation=self.generation)

    def close(self) -> None:
        self.ready = False


def publish(index) -> str:
    with IndexWriter.open(index) as writer:
        writer.publish({})
        return writer.generation


@pytest.fixture
def switch(tmp_path, monkeypatch):
    monkeypatch.setattr(generations, "RagPipeline", Pipeline)
    Pipeline.seen_switch_interval = []
    index = tmp_path / "index"
    publish(index)
    switch = IndexGenerationSwitch(Pipeline(None, index))
    switch.warm_up()
    yield switch
    switch.close()


def wait_dead(ref: weakref.ref, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ref() is None, "the retired pipeline was not released"


def test_a_successor_loads_with_short_switch_slices(switch):
    before = sys.getswitchinterval()
    assert before > LOADING_SWITCH_INTERVAL_S
    new = publish(switch.index_dir)
    assert switch.reload().outcome == "swapped" and switch.generation == new
    assert Pipeline.seen_switch_interval[-1] == LOADING_SWITCH_INTERVAL_S
    assert sys.getswitchinterval() == before


def test_a_generation_freed_as_it_is_dropped_costs_no_collection(switch):
    old = weakref.ref(switch.current)
    publish(switch.index_dir)
    switch.reload()
    wait_dead(old)
    assert switch.collections == 0


def test_a_generation_kept_by_a_cycle_is_collected(switch):
    gc.disable()  # only the retirement's own collection may free it
    try:
        switch.current.itself = switch.current  # a reference cycle: only the collector frees it
        old = weakref.ref(switch.current)
        publish(switch.index_dir)
        switch.reload()
        wait_dead(old)
    finally:
        gc.enable()
    assert switch.collections == 1


def test_switch_intervals_taken_at_once_restore_the_first_value():
    before = sys.getswitchinterval()
    outer = generations._switch_interval(LOADING_SWITCH_INTERVAL_S)
    inner = generations._switch_interval(LOADING_SWITCH_INTERVAL_S)
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # the first to begin ends first: another load still runs
    assert sys.getswitchinterval() == LOADING_SWITCH_INTERVAL_S
    inner.__exit__(None, None, None)
    assert sys.getswitchinterval() == before
