"""A request's priority under load (rag/api/admission.py, rag/api/access.py): ``X-Request-Priority``, within its API
key's priority from the keys file, which a header may lower but never raise; counted by priority over HTTP."""

from __future__ import annotations

import httpx
import pytest

from api_testkit import metric_values, serve_live, with_sections
from rag.api.access import key_line, new_key, read_keys_file
from rag.api.admission import parse_priority_header
from rag.errors import ConfigurationError
from rag.pipeline import RagPipeline

QUERY = "0-dimensional biomaterials lack inductive properties."


@pytest.mark.parametrize(("header", "key", "expected"), [(None, "normal", "normal"), (None, "low", "low"),
                                                         ("low", "high", "low"), ("high", "low", "low"),
                                                         ("HIGH ", "high", "high")])
def test_a_header_lowers_the_key_s_priority_and_never_raises_it(header, key, expected):
    assert parse_priority_header(header, key) == expected


def test_a_keys_file_line_carries_its_priority(tmp_path):
    key = new_key()
    path = tmp_path / "keys"
    path.write_text(f"{key_line(key, 'batch', 'low')}\n{key_line(new_key())}\n")
    first, second = read_keys_file(path)
    assert (first.name, first.priority) == ("batch", "low") and second.priority == "normal"
    path.write_text(f"{key_line(key).split()[0]} priority=urgent\n")
    with pytest.raises(ConfigurationError, match="line 1") as error:
        read_keys_file(path)
    assert key not in str(error.value)
    with pytest.raises(ValueError, match="priority"):
        key_line(key, "x", "urgent")


def _low_answered(url: str, key: str) -> float:
    text = httpx.get(url + "/metrics", headers={"X-API-Key": key}, timeout=30).text
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "ragheat_requests_priority_total" and s.labels == {"priority": "low", "outcome": "answered"})


def test_a_low_priority_key_s_queries_are_counted_low(settings, subset_index, tmp_path):
    batch, interactive = new_key(), new_key()
    keys = tmp_path / "keys"
    keys.write_text(f"{key_line(batch, 'batch', 'low')}\n{key_line(interactive, 'web')}\n")
    s = with_sections(settings, server={"reload_poll_s": 0, "api_keys_file": keys})
    with serve_live(s, RagPipeline(s, subset_index)) as live:
        before = _low_answered(live.url, interactive)
        for key, header in ((batch, None), (batch, "high"), (interactive, None)):
            headers = {"X-API-Key": key} | ({"X-Request-Priority": header} if header else {})
            response = httpx.post(live.url + "/v1/query", json={"query": QUERY}, headers=headers, timeout=60)
            assert response.status_code == 200, response.text
        assert _low_answered(live.url, interactive) - before == 2, "the batch key's queries, even asking for high"
