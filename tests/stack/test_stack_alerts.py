"""The page, end to end through the local stack: ``ragheat stack up --rules-profile test`` (the real Prometheus
evaluating the rendered burn-rate rules, the real Alertmanager with the rendered routes, the stack's alert
receiver) with a delay injected into one stage of the API (``faults`` settings, the language model off). Under
load the fast-burn page must fire, go through Alertmanager's page route and reach the receiver naming the stage.
Then an index generation whose dense vectors come from another embedding space is published into the index the
stack serves (as ingest publishes, hot-swapped): the quality page must reach the receiver through the quality
SLO's route, naming the signal that moved.

Robust on a loaded machine: one unambiguous fault (a full second in ``fuse``, a stage that takes well under a
millisecond when healthy), the test profile's seconds-long windows and timers, and bounded waits that poll."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import httpx
import pytest

from dashboards import quality, slo
from index_copy import copy_index
from loadgen.quality_drill import broken_generation, rotate_dense_vectors
from tests.stack.conftest import FREE_PORTS, RAGHEAT

pytestmark = pytest.mark.slow

DELAYED_STAGE = "fuse"
DELAY_MS = 600  # past the SLO on every request, short enough that four clients keep the quality windows filled
PAGE_WITHIN_S = 180  # typically 10-20 s here; generous for a machine under a CPU hog


class Load:
    """``threads`` clients on loopback, each sending the next of ``queries`` as soon as the last is answered."""

    def __init__(self, url: str, queries: list[str], threads: int = 4) -> None:
        self.url, self.stop, self.statuses, self.queries = url, threading.Event(), [], queries
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(threads)]

    def _client(self, offset: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            i = offset
            while not self.stop.is_set():
                try:
                    query = self.queries[i % len(self.queries)]
                    self.statuses.append(client.post("/v1/query", json={"query": query}).status_code)
                except httpx.HTTPError as exc:
                    self.statuses.append(type(exc).__name__)
                i += 1

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def fast_burn_page(receiver_url: str) -> tuple[dict, dict] | None:
    """(notification, alert) of the first firing fast-burn latency page the receiver got, if any."""
    for note in httpx.get(receiver_url + "/alerts", timeout=10).json():
        for alert in note["alerts"]:
            labels = alert["labels"]
            if (note["status"] == "firing" and alert["status"] == "firing"
                    and labels.get("alertname") == "RagheatLatencyBudgetBurn" and labels.get("burn") == "fast"):
                return note, alert
    return None


@pytest.fixture(scope="module")
def questions(scifact_subset) -> list[str]:
    """The served corpus' own questions: every answer has a good passage until the index is broken."""
    return [json.loads(line)["text"] for line in (scifact_subset / "queries.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def faulty_stack(subset_index, scifact_subset, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stack-alerts")
    index = copy_index(subset_index, folder / "index")  # a broken generation is published into it
    # The quality SLO's threshold and drift references fitted on the served corpus' own questions, as a deployment
    # calibrates (docs/quality.md): the shipped calibration is the whole corpora's, whose best passages lie closer.
    calibration = folder / "calibration.json"
    fitted = subprocess.run([RAGHEAT, "calibrate-quality", "--beir", str(scifact_subset), "--split", "train",
                             "--index", str(index), "--out", str(calibration)], capture_output=True, text=True,
                            timeout=300)
    assert fitted.returncode == 0, fitted.stderr[-3000:]
    # The fault is the API's own setting; `stack up` passes its environment on to the API.
    env = {**os.environ, "COLUMNS": "200", "RAGHEAT_FAULTS__DELAY_STAGE": DELAYED_STAGE,
           "RAGHEAT_FAULTS__DELAY_MS": str(DELAY_MS), "RAGHEAT_GENERATION__GENERATOR": "extractive",
           # No load controller: it would step down to a rung without the delayed stage, and this test waits for
           # the page a slow stage fires. No answer cache: every answer is measured anew. A published generation
           # is served within a second.
           "RAGHEAT_STEERING__ENABLED": "false", "RAGHEAT_CACHE__ENABLED": "false",
           "RAGHEAT_SERVER__RELOAD_POLL_S": "1", "RAGHEAT_QUALITY__CALIBRATION": str(calibration)}
    up = subprocess.run([RAGHEAT, "stack", "up", "--index", str(index), "--folder", str(folder), *FREE_PORTS,
                         "--rules-profile", "test", "--probes", "off"], capture_output=True, text=True, timeout=420,
                        env=env)
    try:
        assert up.returncode == 0, f"ragheat stack up failed:\n{up.stderr[-3000:]}"
        state = json.loads((folder / "state.json").read_text())
        yield {p["name"]: p["url"] for p in state["processes"]}, up, index
    finally:
        subprocess.run([RAGHEAT, "stack", "down", "--folder", str(folder)], capture_output=True, timeout=120)


def test_an_injected_stage_delay_pages_through_alertmanager_naming_the_stage(faulty_stack, questions):
    urls, up, _ = faulty_stack
    assert "answers: extractive" in up.stderr and "vllm" not in urls  # no language model: one fault, one stage
    receiver = urls["alert-receiver"]
    assert httpx.get(receiver + "/alerts", timeout=10).json() == []  # nothing paged before the load
    started = time.monotonic()
    page = None
    named = None
    with Load(urls["api"], questions) as load:
        while page is None and time.monotonic() - started < PAGE_WITHIN_S:
            time.sleep(1.0)
            page = fast_burn_page(receiver)
        # The stage annotation is a query Prometheus runs at each evaluation over the short window (seconds in this
        # drill's profile): an evaluation that found no stage sample there says "unknown" (a scrape starved on two
        # loaded cores). The page may carry that; the firing alert must then name the stage at a later evaluation.
        # Likewise an evaluation whose short window does not yet hold two samples of the delayed stage's slow
        # observations names the stage with the highest P99 before it: the firing alert must name the delayed one
        # once the window holds them.
        if page is not None and page[1]["annotations"].get("stage") != DELAYED_STAGE:
            deadline = time.monotonic() + 60
            while named is None and time.monotonic() < deadline:
                time.sleep(1.0)
                named = next((a for a in httpx.get(urls["prometheus"] + "/api/v1/alerts", timeout=10).json()["data"]
                              ["alerts"] if a["labels"].get("alertname") == "RagheatLatencyBudgetBurn"
                              and a["labels"].get("burn") == "fast" and a["state"] == "firing"
                              and a["annotations"].get("stage") == DELAYED_STAGE), None)
    firing = httpx.get(urls["prometheus"] + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    assert page is not None, (f"no fast-burn page reached the receiver within {PAGE_WITHIN_S} s; answers "
                              f"{sorted(set(map(str, load.statuses)))} x{len(load.statuses)}; Prometheus alerts: "
                              f"{[(a['labels'].get('alertname'), a['labels'].get('burn'), a['state']) for a in firing]}")
    note, alert = page
    assert load.statuses and set(load.statuses) == {200}, load.statuses
    # Routed by Alertmanager: the page route's receiver and webhook, severity page, the latency SLO.
    assert note["route"] == "page" and note["receiver"] == "page", note
    assert alert["labels"]["severity"] == "page" and alert["labels"]["slo"] == "latency", alert
    # The annotation names the delayed stage: its p99 dwarfs every other stage's.
    if alert["annotations"]["stage"] != DELAYED_STAGE:
        assert named is not None, f"the firing alert never named {DELAYED_STAGE}: {alert}"
        alert = named
    assert alert["annotations"]["stage"] == DELAYED_STAGE, alert
    assert f"stage: {DELAYED_STAGE}" in alert["annotations"]["summary"], alert
    # The evidence names it too: as the stage that alone took longer than the SLO, or, when the compressed profile's
    # few-second window holds too few scrapes for that rate, as the stage with the highest P99.
    evidence = alert["annotations"].get("stage_evidence", DELAYED_STAGE)
    assert evidence.startswith(DELAYED_STAGE) or f"; {DELAYED_STAGE} has the highest P99" in evidence, alert
    print(f"fast-burn page received {time.monotonic() - started:.1f} s after the load started "
          f"({len(load.statuses)} requests)")


def quality_pages(receiver_url: str) -> list[tuple[dict, dict]]:
    """(notification, alert) of every firing quality page the receiver got."""
    return [(note, alert) for note in httpx.get(receiver_url + "/alerts", timeout=10).json()
            for alert in note["alerts"] if note["status"] == "firing" and alert["status"] == "firing"
            and alert["labels"].get("slo") == "quality" and alert["labels"].get("severity") == "page"]


def test_a_generation_from_another_encoders_space_pages_for_quality_through_alertmanager(faulty_stack, questions):
    """Runs after the latency page: the stack's own rules and routes page for answer quality too."""
    urls, _, index = faulty_stack
    receiver = urls["alert-receiver"]
    healthy_s = 2 * quality.DRIFT_LONG_S / slo.TEST.divisor  # both drift windows filled with healthy answers
    with Load(urls["api"], questions) as load, broken_generation(index, rotate_dense_vectors) as publish:
        time.sleep(healthy_s)
        assert quality_pages(receiver) == [], "a quality page while every answer was healthy"
        publish()
        published, pages = time.monotonic(), []
        while not pages and time.monotonic() - published < PAGE_WITHIN_S:
            time.sleep(1.0)
            pages = quality_pages(receiver)
    assert pages, (f"no quality page reached the receiver within {PAGE_WITHIN_S} s of the publish; answers "
                   f"{sorted(set(map(str, load.statuses)))} x{len(load.statuses)}")
    note, alert = pages[0]
    assert set(load.statuses) == {200}, load.statuses
    # Alertmanager's quality route (its matcher in the group key), its page receiver; the alert names what moved.
    assert note["route"] == "page" and note["receiver"] == "page" and 'slo="quality"' in note["group_key"], note
    assert alert["labels"]["alertname"] in (quality.DRIFT_ALERT, slo.alert_name(slo.QUALITY)), alert
    if alert["labels"]["alertname"] == quality.DRIFT_ALERT:
        assert alert["labels"]["signal"] in ("best_similarity", "retriever_agreement"), alert
    print(f"quality page received {time.monotonic() - published:.1f} s after the publish: {alert['labels']}")
