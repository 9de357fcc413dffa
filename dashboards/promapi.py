"""The few Prometheus HTTP API calls the checks and snapshots need."""

from __future__ import annotations

import httpx

from rag.errors import RagheatError


class PrometheusQueryError(RagheatError):
    """Prometheus answered with an error (a bad expression) or could not be reached; names the URL."""


class PrometheusApi:
    """The few calls of Prometheus's HTTP API the checks and snapshots need."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict | list) -> object:
        try:
            response = httpx.get(self.url + path, params=params, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise PrometheusQueryError(f"cannot reach Prometheus at {self.url}: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            raise PrometheusQueryError(f"{self.url}{path} answered {response.status_code} without JSON: "
                                       f"is {self.url} a Prometheus?") from None
        if body.get("status") != "success":
            raise PrometheusQueryError(f"{body.get('errorType', 'error')}: {body.get('error')}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """Instant query (now, or at unix time ``at``): a list of ``{"metric": {...}, "value": [t, "v"]}``."""
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        return self._get("/api/v1/query", params)["result"]

    def exemplars(self, selector: str, start: float, end: float) -> list[dict]:
        """The exemplars of the series ``selector`` picks between two unix times (empty when storage is off)."""
        return self._get("/api/v1/query_exemplars", {"query": selector, "start": f"{start:.3f}",
                                                     "end": f"{end:.3f}"}) or []

    def query_range(self, promql: str, start: float, end: float, step_s: float) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step_s:g}"})["result"]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = [("match[]", match)] if match else []
        return self._get(f"/api/v1/label/{label}/values", params)

    def metric_names(self, match: str | None = None) -> set[str]:
        """Every series name, or those of the series ``match`` selects (e.g. one job's)."""
        return set(self.label_values("__name__", match=match))

    def alerts(self) -> list[dict]:
        return self._get("/api/v1/alerts", {})["alerts"]
