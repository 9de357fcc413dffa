"""The Milvus board against Milvus' own metrics as a real Prometheus scrapes them.

No Milvus server runs here (no Docker engine; milvus-lite, the embedded server the tests use, exports no metrics), so
the scrape target is an exporter of the families the board reads, written as Milvus writes them: its Go client's text
format (``# TYPE`` lines, counters without ``_total``), its label names, its histogram buckets (milliseconds, 1 to
131072, doubling). Every query of the board must return data for the ``milvus`` job; the live board test lists these
queries as absent for that reason.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dashboards import slo
from dashboards.boards import milvus_board
from dashboards.promapi import PrometheusApi
from dashboards.spec import JOB, SCRAPED, SOURCE, SOURCE_VALUES, expand
from dashboards.verify import check_boards
from stack.prometheus import LocalPrometheus

pytestmark = pytest.mark.slow

BUCKETS_MS = [2.0 ** i for i in range(18)]  # Milvus' ExponentialBuckets(1, 2, 18)


def _histogram(name: str, series: list[tuple[str, float]], scrape: int) -> list[str]:
    """A cumulative histogram: each ``(labels, typical_ms)`` series gains ten observations near ``typical_ms`` per
    scrape."""
    count = 10 * scrape
    lines = [f"# HELP {name} latency of search or query", f"# TYPE {name} histogram"]
    for labels, typical_ms in series:
        for edge in BUCKETS_MS:
            lines.append(f'{name}_bucket{{{labels},le="{edge:g}"}} {count if edge >= typical_ms else 0}')
        lines += [f'{name}_bucket{{{labels},le="+Inf"}} {count}', f"{name}_sum{{{labels}}} {count * typical_ms}",
                  f"{name}_count{{{labels}}} {count}"]
    return lines


def milvus_exposition(scrape: int) -> str:
    """What a Milvus standalone's /metrics holds of the board's families after ``scrape`` scrapes, spelt out here as
    Milvus spells it (pkg/metrics), not from ragheat's contract, so a wrong name or label there shows: each proxy call
    counted as ``total`` and again by outcome, a query node's searches as leader (``OnLeader``) and as the sub-searches
    it sends (``FromLeader``, slower here)."""
    lines = _histogram("milvus_proxy_sq_latency", [('node_id="1",query_type="search"', 3.0),
                                                   ('node_id="1",query_type="query"', 300.0)], scrape)
    lines += _histogram("milvus_querynode_sq_req_latency",
                        [('node_id="1",query_type="search",scope="OnLeader"', 2.0),
                         ('node_id="1",query_type="search",scope="FromLeader"', 64.0)], scrape)
    lines += ["# HELP milvus_proxy_req_count count of operation executed", "# TYPE milvus_proxy_req_count counter"]
    for function, status, per_scrape in (("Search", "total", 21), ("Search", "success", 20), ("Search", "fail", 1),
                                         ("Insert", "total", 5), ("Insert", "success", 5)):
        lines.append(f'milvus_proxy_req_count{{node_id="1",function_name="{function}",status="{status}"}} '
                     f"{per_scrape * scrape}")
    lines += ["# HELP milvus_querynode_entity_num number of entities which can be searched/queried",
              "# TYPE milvus_querynode_entity_num gauge",
              'milvus_querynode_entity_num{node_id="1",collection_id="451",partition_id="452",segment_state="Sealed",'
              'indexed_field_count="2"} 9767',
              "# HELP process_resident_memory_bytes Resident memory size in bytes.",
              "# TYPE process_resident_memory_bytes gauge", "process_resident_memory_bytes 3.5e+08"]
    return "\n".join(lines) + "\n"


class _Exporter(BaseHTTPRequestHandler):
    scrapes = 0

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).scrapes += 1
        body = milvus_exposition(self.scrapes).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_every_panel_of_the_milvus_board_reads_milvus_own_metrics():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"
    board = milvus_board(slo.TEST)
    window = slo.TEST.window(slo.QUANTILE_WINDOW_S)
    by_title = {p.title: p.queries[0] for p in board.panels}
    try:
        with LocalPrometheus(target, scrape_interval_s=1.0, extra_targets={"milvus": target}) as url:
            api = PrometheusApi(url)
            deadline = time.monotonic() + 30
            while True:  # rates need two scrapes inside the window
                checks = check_boards(api, [board], window, job="milvus")
                if all(c.status == "ok" for c in checks) or time.monotonic() > deadline:
                    break
                time.sleep(1)

            def read(title: str) -> list[dict]:
                return api.query(expand(by_title[title].expr, window, {SOURCE: SOURCE_VALUES[SCRAPED],
                                                                       JOB: "milvus"}))

            outcomes = {r["metric"].get("status") for r in read("Requests by operation and outcome")}
            node = {r["metric"]["le"]: float(r["value"][1]) for r in read("Search latency (query node)")}
            proxy = {r["metric"]["le"]: float(r["value"][1]) for r in read("Search latency (Milvus proxy)")}
    finally:
        server.shutdown()
    assert len(checks) == sum(len(p.queries) for p in board.panels) == 5
    assert all(c.status == "ok" for c in checks), [(c.panel, c.status, c.detail) for c in checks if c.status != "ok"]
    assert outcomes == {"success", "fail"}  # each call once, by its outcome: not again as total
    assert node["2"] > 0 and node["64"] == node["2"]  # the leader's searches only, not its sub-searches
    assert proxy["4"] > 0 and proxy["256"] == proxy["4"]  # searches, not queries
