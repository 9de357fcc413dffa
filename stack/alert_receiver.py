"""The stack's default Alertmanager receiver: ``POST /page`` and ``POST /ticket`` take Alertmanager's webhook
payload and log one JSON line per notification (route, status, alert names, labels, the blamed stage), so a fresh
stack shows where its alerts go; ``GET /alerts`` returns the last ones received, ``GET /healthz`` is 200.
Replace it with a real pager by rendering the routes with other webhooks (``ragheat dashboards render``).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROUTES = ("page", "ticket")
MAX_BODY_BYTES = 1 << 20
KEEP = 200


KEPT_ANNOTATIONS = ("cause", "cause_evidence", "stage", "stage_evidence", "verdict", "verdict_evidence", "drift",
                    "signal", "points_at", "summary")
"""Annotations worth a log line: the cause of a slower tail and its evidence, which pipeline stage is to blame and
why (a quality alert: which bad verdict dominates, and the best similarity's drift; a drift page: the signal that
moved and what it points at), and the one-line summary (not the description's prose)."""


def summarize(route: str, payload: dict) -> dict:
    """The parts of a webhook payload worth a log line: what fired, where it was routed (the webhook's path, the
    receiver and Alertmanager's group key, which names the route's matchers), and which stage."""
    return {"route": route, "status": payload.get("status"), "receiver": payload.get("receiver"),
            "group_key": payload.get("groupKey"),
            "alerts": [{"name": a.get("labels", {}).get("alertname"), "status": a.get("status"),
                        "labels": a.get("labels", {}),
                        "annotations": {k: v for k, v in (a.get("annotations") or {}).items() if k in KEPT_ANNOTATIONS}}
                       for a in payload.get("alerts", [])]}


class AlertReceiver(ThreadingHTTPServer):
    """``AlertReceiver(("127.0.0.1", 9095)).serve_forever()``; ``received`` holds the latest notifications."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], out=None) -> None:
        super().__init__(address, _Handler)
        self.received: deque[dict] = deque(maxlen=KEEP)
        self.out = out or sys.stdout
        self.lock = threading.Lock()

    def record(self, note: dict) -> None:
        with self.lock:
            self.received.append(note)
            self.out.write(json.dumps(note, sort_keys=True) + "\n")
            self.out.flush()


class _Handler(BaseHTTPRequestHandler):
    server: AlertReceiver

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        route = self.path.strip("/")
        if route not in ROUTES:
            return self._reply(404, {"error": f"no route {self.path}; use /page or /ticket"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return self._reply(413, {"error": "body over 1 MiB"})
        try:
            payload = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            return self._reply(400, {"error": f"not an Alertmanager webhook payload: {exc}"})
        self.server.record(summarize(route, payload))
        self._reply(200, {"ok": True})

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/healthz":
            return self._reply(200, {"ok": True})
        if self.path == "/alerts":
            with self.server.lock:
                return self._reply(200, list(self.server.received))
        self._reply(404, {"error": f"no route {self.path}"})

    def _reply(self, status: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # requests are not news; notifications are logged above
        pass
