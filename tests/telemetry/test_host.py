"""``telemetry.host``: the service's CPU is its process tree's, reaped children included, a Prometheus it runs for the
operator left out, and the counter never steps back, even when the processes answering the scrapes take turns."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry

from telemetry.host import CLOCK_TICKS, HighWater, HostCollector, tree_cpu_seconds


def _process(proc: Path, pid: int, ppid: int, comm: str, own_s: float, reaped_s: float = 0.0) -> None:
    """A /proc/PID/stat whose utime and cutime carry ``own_s`` and ``reaped_s`` (stime and cstime at zero)."""
    ticks = [round(own_s * CLOCK_TICKS), 0, round(reaped_s * CLOCK_TICKS), 0]
    fields = ["S", str(ppid)] + ["0"] * 9 + [str(t) for t in ticks] + ["0"] * 30
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")


def _service(proc: Path) -> None:
    _process(proc, 1, 0, "init", 100.0)
    _process(proc, 10, 1, "ragheat", 2.0, reaped_s=3.0)  # the supervisor; a worker it restarted spent 3 s
    _process(proc, 11, 10, "rh:http", 5.0)  # a worker (its main thread named)
    _process(proc, 12, 10, "ragheat (worker) 2", 4.0)  # a name with a space and a parenthesis
    _process(proc, 13, 11, "redis-server", 0.5)  # the worker's graph store
    _process(proc, 14, 10, "prometheus", 7.0)  # the operator's Prometheus (--prometheus) ...
    _process(proc, 15, 14, "helper", 1.0)  # ... and anything under it
    _process(proc, 20, 1, "neighbour", 50.0)


def test_the_tree_counts_every_process_under_the_root_and_what_they_reaped(tmp_path):
    _service(tmp_path)
    assert tree_cpu_seconds(10, tmp_path) == 2.0 + 3.0 + 5.0 + 4.0 + 0.5
    assert tree_cpu_seconds(11, tmp_path) == 5.5  # a worker alone: itself and its graph store
    assert tree_cpu_seconds(99, tmp_path) is None  # gone


def test_the_collector_reports_its_root_s_tree_and_never_steps_back(tmp_path):
    _service(tmp_path)
    collector = HostCollector(proc=tmp_path, root=10)
    registry = CollectorRegistry()
    registry.register(collector)
    assert registry.get_sample_value("ragheat_process_cpu_seconds_total") == 14.5
    (tmp_path / "13").joinpath("stat").unlink()  # the graph store left the tree (its worker died first)
    assert registry.get_sample_value("ragheat_process_cpu_seconds_total") == 14.5
    _process(tmp_path, 11, 10, "rh:http", 6.0)
    assert registry.get_sample_value("ragheat_process_cpu_seconds_total") == 15.0


def test_workers_answering_in_turn_share_one_high_water_mark(tmp_path):
    first, second = HighWater(tmp_path / "mark"), HighWater(tmp_path / "mark")
    assert first(3.0) == 3.0
    assert second(2.5) == 3.0  # the other worker saw less of the tree: the counter holds
    assert second(4.0) == 4.0 and first(3.5) == 4.0


def test_without_a_root_the_collector_reads_this_process():
    times = os.times()
    assert HostCollector().service_cpu_seconds() >= times.user + times.system - 0.05  # and its children's, if any
