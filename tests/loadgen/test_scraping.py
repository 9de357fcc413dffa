"""Which Prometheus a sweep's steps are explained from, and the one sentence that says why when there is none."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from loadgen.scraping import instance_of, step_metrics
from stack.servers import BackgroundServer

OPEN = {"mode": "open", "levels": [5.0, 50.0], "duration_s": 10.0}


def metrics_app(text: str) -> Starlette:
    """A service serving ``text`` at /metrics (and /readyz, which BackgroundServer waits for)."""
    return Starlette(routes=[Route("/metrics", lambda request: PlainTextResponse(text)),
                             Route("/readyz", lambda request: PlainTextResponse("ok"))])


@pytest.mark.parametrize("options, enabled, reason", [
    ({**OPEN, "mode": "closed"}, True, "a closed-loop sweep has no knee"),
    ({**OPEN, "levels": [5.0]}, True, "a sweep of one step has no other step to compare it with"),
    ({**OPEN, "duration_s": 2.0}, True, "steps of 2 s hold too few scrapes to compare (--duration 5 or more"),
    (OPEN, False, "not asked for (--no-explain)"),
])
def test_a_sweep_that_cannot_be_explained_says_why_before_anything_starts(options, enabled, reason):
    with step_metrics("http://127.0.0.1:9", prometheus_url="http://127.0.0.1:9090", enabled=enabled,
                      **options) as metrics:
        assert metrics.prometheus_url is None and metrics.reason.startswith(reason), metrics.reason


def test_a_given_prometheus_is_used_as_it_is():
    with step_metrics("http://127.0.0.1:8000", prometheus_url="http://prom:9090/", enabled=True, **OPEN) as metrics:
        assert (metrics.prometheus_url, metrics.instance, metrics.reason) == ("http://prom:9090", "127.0.0.1:8000",
                                                                               None)
        assert metrics.source == "the Prometheus at http://prom:9090/"


def test_a_target_without_metrics_says_why_no_local_prometheus_scrapes_it():
    with step_metrics("http://127.0.0.1:9/api", prometheus_url=None, enabled=True, **OPEN) as metrics:
        assert metrics.prometheus_url is None
        assert metrics.reason.startswith("http://127.0.0.1:9/metrics could not be read (ConnectError"), metrics.reason
    with step_metrics("https://rag.example:8443", prometheus_url=None, enabled=True, **OPEN) as metrics:
        assert metrics.reason == ("a local Prometheus scrapes plain HTTP and https://rag.example:8443 is not: give "
                                  "--prometheus URL of one that scrapes it")


def test_a_target_that_exports_other_metrics_is_not_scraped():
    with BackgroundServer(metrics_app("# TYPE http_requests_total counter\nhttp_requests_total 3\n")) as url, \
            step_metrics(url, prometheus_url=None, enabled=True, **OPEN) as metrics:
        assert metrics.prometheus_url is None
        assert metrics.reason == (f"{url}/metrics exports no ragheat_request_duration_seconds (only a service "
                                  "ragheat observes can be explained: ragheat serve, or one using ragheat.observe)")


def test_a_target_exporting_ragheat_metrics_gets_a_local_prometheus_for_the_block():
    import httpx

    exposition = ('# TYPE ragheat_request_duration_seconds histogram\n'
                  'ragheat_request_duration_seconds_bucket{le="+Inf"} 1\nragheat_request_duration_seconds_count 1\n'
                  'ragheat_request_duration_seconds_sum 0.1\n')
    with BackgroundServer(metrics_app(exposition)) as url:
        with step_metrics(url, prometheus_url=None, enabled=True, **OPEN) as metrics:
            assert metrics.reason is None and metrics.instance == instance_of(url)
            assert metrics.source == f"a local Prometheus scraping {metrics.instance}/metrics every 1 s"
            up = httpx.get(metrics.prometheus_url + "/api/v1/query", params={"query": "up"}, timeout=10).json()
            assert [r["metric"]["instance"] for r in up["data"]["result"]] == [metrics.instance]
        with pytest.raises(httpx.ConnectError):  # stopped with the block
            httpx.get(metrics.prometheus_url + "/-/ready", timeout=5)
