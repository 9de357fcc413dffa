"""rag/placement.py and the settings file: the cores, the memory modes, what the host lacks, and where settings
come from (flags > environment > RAGHEAT_SETTINGS_FILE > defaults)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rag.errors import ConfigurationError
from rag.placement import (format_cpu_list, host_capabilities, huge_page_copy, parse_cpu_list, pin_process,
                           usable_cpus)
from rag.settings import SETTINGS_FILE_ENV, RagheatSettings


def test_cpu_lists_read_and_write_as_taskset_does():
    assert parse_cpu_list("0-3,6") == {0, 1, 2, 3, 6}
    assert parse_cpu_list(" 2 , 0 ") == {0, 2}
    assert format_cpu_list({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    assert format_cpu_list(parse_cpu_list("4,1-2,3")) == "1-4"
    for bad, words in (("x", "not a CPU number"), ("3-1", "must run upwards"), ("", "no CPU"), ("-1", "not a CPU")):
        with pytest.raises(ValueError, match=words):
            parse_cpu_list(bad)


def test_the_setting_is_validated_and_normalised_with_its_name():
    assert RagheatSettings(placement={"cpus": "1,0"}).placement.cpus == "0-1"
    with pytest.raises(ValueError, match="placement.cpus"):
        RagheatSettings(placement={"cpus": "zero"})
    with pytest.raises(ValueError, match="placement.memory"):
        RagheatSettings(placement={"memory": "pinned"})


def test_pinning_moves_every_thread_and_the_ones_started_later():
    """In a child: a thread started before the pin and one started after both end up on the one core."""
    core = min(usable_cpus())
    code = f"""
import os, threading, time
from rag.placement import pin_process
ready, seen = threading.Event(), {{}}
def early():
    ready.wait(); seen["early"] = os.sched_getaffinity(0)
t = threading.Thread(target=early); t.start()
pin_process(frozenset({{{core}}}))
ready.set(); t.join()
late = threading.Thread(target=lambda: seen.__setitem__("late", os.sched_getaffinity(0))); late.start(); late.join()
print(sorted(seen["early"]), sorted(seen["late"]), sorted(os.sched_getaffinity(0)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    assert out == f"[{core}] [{core}] [{core}]"


def test_a_core_the_process_may_not_use_is_refused_naming_the_setting():
    outside = max(usable_cpus()) + 64
    with pytest.raises(ConfigurationError, match=f"placement.cpus lists {outside}"):
        pin_process(frozenset({outside}))


def test_a_huge_page_copy_holds_the_same_values_and_is_writable_memory_of_its_own():
    source = np.arange(3 * 1024 * 1024, dtype=np.int8).reshape(-1, 128)
    copy = huge_page_copy(source)
    assert copy.shape == source.shape and copy.dtype == source.dtype and np.array_equal(copy, source)
    assert not np.shares_memory(copy, source)


def test_locking_locks_what_the_process_maps(tmp_path):
    """In a child (the lock is the process's for its life): VmLck grows past the mapped index, or the refusal
    names the setting and the way out."""
    code = """
import numpy as np
from rag.errors import ConfigurationError
from rag.placement import lock_mapped_memory
data = np.ones(8 << 20, np.uint8)
try:
    lock_mapped_memory()
except ConfigurationError as exc:
    print("refused", exc)
else:
    print("locked", [l for l in open('/proc/self/status') if l.startswith('VmLck')][0].split()[1])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    if os.geteuid() == 0:  # CAP_IPC_LOCK: no limit applies
        assert out.startswith("locked") and int(out.split()[1]) > 8 * 1024, out
    else:
        assert out.startswith("locked") or ("placement.memory=lock" in out and "ulimit -l" in out), out


def test_host_capabilities_say_what_is_missing_in_words():
    caps = host_capabilities()
    assert parse_cpu_list(caps["cpus"]) == usable_cpus() and caps["cores"] == len(usable_cpus())
    assert set(caps["lacks"]) <= {"isolated_cores", "cache_allocation", "huge_pages", "memory_lock"}
    assert all(isinstance(why, str) and len(why) > 30 for why in caps["lacks"].values())
    assert ("isolated_cores" in caps["lacks"]) == (caps["isolated_cores"] is None)


def test_the_settings_file_sits_between_the_environment_and_the_defaults(tmp_path, monkeypatch):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"placement": {"memory": "lock"}, "rerank": {"candidates": 30}}))
    monkeypatch.setenv(SETTINGS_FILE_ENV, str(path))
    monkeypatch.setenv("RAGHEAT_RERANK__CANDIDATES", "20")
    s = RagheatSettings()
    assert s.placement.memory == "lock"  # from the file
    assert s.rerank.candidates == 20  # the environment wins over the file
    assert RagheatSettings(rerank={"candidates": 10}).rerank.candidates == 10  # flags win over both
    assert s.retrieval.candidates == RagheatSettings.model_fields["retrieval"].default_factory().candidates


@pytest.mark.parametrize("content, words", [(None, "no such file"), ("{not json", "not readable JSON"),
                                            ("[1, 2]", "a JSON object of sections"),
                                            ('{"placement": {"cores": 2}}', "placement.cores")])
def test_a_bad_settings_file_is_refused_naming_it(tmp_path, monkeypatch, content, words):
    path = tmp_path / "settings.json"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv(SETTINGS_FILE_ENV, str(path))
    with pytest.raises(ValueError, match=words):
        RagheatSettings()
