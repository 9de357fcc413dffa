"""The OpenAPI contract, held by a fuzzer: schemathesis runs every check it has (server errors, status codes, content
types, response headers and schemas, negative data rejected, schema-valid data accepted, 405 with ``Allow``, auth
enforced) against a live server on loopback, with and without API keys, and must find nothing. ``rag.api.openapi``
states the bounds the service enforces so that both directions hold.

Bounded (``--max-examples``) so that a run takes seconds, not minutes; the seed is printed on failure to replay it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from api_testkit import KEYS, serve_live, with_sections
from rag.pipeline import RagPipeline

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
MAX_EXAMPLES = 40
SEED = os.environ.get("RAGHEAT_CONTRACT_SEED", "20261201")
"""Fixed, so that the suite is repeatable; set RAGHEAT_CONTRACT_SEED to explore other cases (a failure prints the
seed that found it, and `st replay` the case)."""


def headers(mode: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS['contract']}"} if mode == "keyed" else {}


@pytest.fixture(scope="module", params=["keyed", "open"])
def live(request, settings, subset_index):
    server = {"reload_poll_s": 0}
    if request.param == "keyed":
        server["api_keys"] = [KEYS["contract"]]
    s = with_sections(settings, server=server, telemetry={"otlp": "off"})
    with serve_live(s, RagPipeline(s, subset_index)) as served:
        yield request.param, served


def test_schemathesis_finds_no_contract_violation(live, tmp_path):
    mode, served = live
    if not SCHEMATHESIS.is_file():
        pytest.fail(f"{SCHEMATHESIS} is missing: install the test extras (scripts/install.sh --test)")
    # Without keys, POST /admin/reload is refused (403) whatever is sent, as its schema says: schemathesis would warn
    # that the operation "returned only 401/403"; the refusal is tested directly below.
    options = ["-H", f"Authorization: Bearer {KEYS['contract']}"] if mode == "keyed" else [
        "--exclude-path", "/admin/reload"]
    operations = 5 if mode == "keyed" else 4
    run = subprocess.run(
        [str(SCHEMATHESIS), "run", served.url + "/openapi.json", "--checks", "all", "--phases",
         "examples,coverage,fuzzing", "--max-examples", str(MAX_EXAMPLES), "--workers", "1", "--request-timeout",
         "60", "--seed", SEED, "--no-color", *options],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-8000:]
    assert "No issues found" in report, report[-4000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", report)
    assert generated, report[-4000:]
    assert int(generated.group(1)) >= 100 and generated.group(1) == generated.group(2), generated.group(0)
    assert re.search(rf"Tested: {operations}\b", report), "every operation is exercised: " + report[-2000:]


def test_schema_states_the_enforced_bounds_and_405_has_allow(live, settings):
    mode, served = live
    spec = httpx.get(served.url + "/openapi.json", timeout=30).json()
    query = spec["components"]["schemas"]["QueryRequest"]["properties"]["query"]
    assert query["minLength"] == 1 and query["maxLength"] == settings.server.max_query_chars
    # "Not all blank", with blank the same for the schema's regular expression and the service: each of these is
    # refused by both, and a query with one other character is accepted by both.
    for blank in ("\u0085", "\ufeff", " \u3000\t", "\u2028"):
        assert re.search(query["pattern"], blank) is None, repr(blank)
        refused = httpx.post(served.url + "/v1/query", json={"query": blank}, headers=headers(mode), timeout=30)
        assert refused.status_code == 422 and "empty" in refused.json()["reason"], (repr(blank), refused.text)
    assert re.search(query["pattern"], "\u0085x")
    top_k = spec["components"]["schemas"]["QueryRequest"]["properties"]["top_k"]
    assert any(option.get("minimum") == 1 and option.get("maximum") == 100 for option in top_k["anyOf"]), top_k
    cases = [("GET", "/v1/query", "POST"), ("DELETE", "/healthz", "GET")]
    cases.append(("GET", "/admin/reload", "POST"))
    if mode == "open":  # the right method, but admin calls need keys
        refused = httpx.post(served.url + "/admin/reload", timeout=30)
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden", refused.text
    for method, path, allowed in cases:
        response = httpx.request(method, served.url + path, headers=headers(mode), timeout=30)
        assert response.status_code == 405, (method, path, response.text)
        assert response.headers["allow"] == allowed
        assert response.json()["error"] == "method_not_allowed" and allowed in response.json()["reason"]
