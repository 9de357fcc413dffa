"""RagheatSettings: environment variables and the validation of setting combinations."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from rag.settings import RagheatSettings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No RAGHEAT_* variable from the caller's shell leaks into these tests."""
    for name in list(os.environ):
        if name.startswith("RAGHEAT_"):
            monkeypatch.delenv(name)


def test_defaults_without_environment():
    s = RagheatSettings()
    assert s.index.kind == "hnsw"
    assert s.server.port == 8000
    assert s.retrieval.retrievers == ["routed"]


def test_nested_environment_variables_are_read(monkeypatch):
    monkeypatch.setenv("RAGHEAT_INDEX__KIND", "flat")
    monkeypatch.setenv("RAGHEAT_SERVER__PORT", "9001")
    s = RagheatSettings()
    assert s.index.kind == "flat"
    assert s.server.port == 9001
    assert isinstance(s.server.port, int)
    # Sibling fields of the same sections keep their defaults.
    assert s.index.hnsw_m == 32
    assert s.server.host == "127.0.0.1"


def test_environment_list_and_float_values(monkeypatch):
    monkeypatch.setenv("RAGHEAT_RETRIEVAL__RETRIEVERS", '["bm25"]')
    monkeypatch.setenv("RAGHEAT_RETRIEVAL__RRF_K", "12.5")
    s = RagheatSettings()
    assert s.retrieval.retrievers == ["bm25"]
    assert s.retrieval.rrf_k == 12.5


def test_invalid_environment_value_names_the_setting(monkeypatch):
    monkeypatch.setenv("RAGHEAT_SERVER__PORT", "not-a-port")
    with pytest.raises(ValidationError) as info:
        RagheatSettings()
    assert "server.port" in str(info.value)


def test_misspelt_nested_environment_variable_is_rejected(monkeypatch):
    monkeypatch.setenv("RAGHEAT_INDEX__KINDD", "flat")
    with pytest.raises(ValidationError) as info:
        RagheatSettings()
    assert "index.kindd" in str(info.value)


@pytest.mark.parametrize("overlap", [240, 300])
def test_overlap_not_smaller_than_window_is_rejected(overlap):
    with pytest.raises(ValidationError) as info:
        RagheatSettings(chunking={"window_tokens": 240, "overlap_tokens": overlap})
    message = str(info.value)
    assert "chunking.overlap_tokens" in message
    assert "chunking.window_tokens" in message


def test_overlap_just_below_window_is_accepted():
    s = RagheatSettings(chunking={"window_tokens": 64, "overlap_tokens": 63})
    assert s.chunking.overlap_tokens == 63


def test_window_must_leave_room_for_special_tokens():
    # max_seq_length 256 leaves 254 word pieces once [CLS] and [SEP] are added.
    assert RagheatSettings(chunking={"window_tokens": 254}).chunking.window_tokens == 254
    with pytest.raises(ValidationError) as info:
        RagheatSettings(chunking={"window_tokens": 255})
    message = str(info.value)
    assert "chunking.window_tokens" in message
    assert "embedding.max_seq_length" in message


def test_window_checked_against_a_smaller_max_seq_length():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(embedding={"max_seq_length": 128}, chunking={"window_tokens": 127, "max_tokens": 100})
    assert "chunking.window_tokens" in str(info.value)


def test_semantic_max_tokens_must_leave_room_for_special_tokens():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(embedding={"max_seq_length": 128}, chunking={"window_tokens": 100, "max_tokens": 127})
    assert "chunking.max_tokens" in str(info.value)


def test_min_tokens_above_max_tokens_is_rejected():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(chunking={"min_tokens": 150, "max_tokens": 100})
    assert "chunking.min_tokens" in str(info.value)


def test_empty_retrievers_rejected():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(retrieval={"retrievers": []})
    assert "retrieval.retrievers" in str(info.value)


def test_empty_retrievers_from_environment_rejected(monkeypatch):
    monkeypatch.setenv("RAGHEAT_RETRIEVAL__RETRIEVERS", "[]")
    with pytest.raises(ValidationError) as info:
        RagheatSettings()
    assert "retrieval.retrievers" in str(info.value)


def test_unknown_retriever_rejected():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(retrieval={"retrievers": ["dense", "splade"]})
    assert "retrieval.retrievers" in str(info.value)


def test_unknown_index_kind_rejected():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(index={"kind": "annoy"})
    message = str(info.value)
    assert "index.kind" in message
    assert "annoy" in message


def test_unknown_index_kind_from_environment_rejected(monkeypatch):
    monkeypatch.setenv("RAGHEAT_INDEX__KIND", "annoy")
    with pytest.raises(ValidationError) as info:
        RagheatSettings()
    assert "index.kind" in str(info.value)


def test_unknown_top_level_key_rejected():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(indexes={"kind": "flat"})
    assert "indexes" in str(info.value)


def test_unknown_section_key_rejected():
    with pytest.raises(ValidationError) as info:
        RagheatSettings(server={"prot": 9001})
    assert "server.prot" in str(info.value)


def test_sections_validate_assignment():
    s = RagheatSettings()
    with pytest.raises(ValidationError) as info:
        s.index.kind = "annoy"
    assert "kind" in str(info.value)
