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

from dashboards import contract, slo
from dashboards.boards import milvus_board
from dashboards.promapi import PrometheusApi
from dashboards.verify import check_boards
from stack.prometheus import LocalPrometheus

pytestmark = pytest.mark.slow

BUCKETS_MS = [2.0 ** i for i in range(18)]  # Milvus' ExponentialBuckets(1, 2, 18)


def _histogram(name: str, labels: str, scrape: int, typical_ms: float) -> list[str]:
    """A cumulative histogram that gains ten observations near ``typical_ms`` per scrape."""
    count = 10 * scrape
    lines = [f"# HELP {name} latency of search or query successfully", f"# TYPE {name} histogram"]
    for edge in BUCKETS_MS:
        lines.append(f'{name}_bucket{{{labels},le="{edge:g}"}} {count if edge >= typical_ms else 0}')
    lines += [f'{name}_bucket{{{labels},le="+Inf"}} {count}', f"{name}_sum{{{labels}}} {count * typical_ms}",
              f"{name}_count{{{labels}}} {count}"]
    return lines


def milvus_exposition(scrape: int) -> str:
    """What a Milvus standalone's /metrics holds of the board's families after ``scrape`` scrapes."""
    m, label = contract.MILVUS, contract.MILVUS_LABEL
    search = f'node_id="1",{label["query_type"]}="search"'
    lines = _histogram(m["search_latency"], search, scrape, 3.0)
    lines += _histogram(m["querynode_latency"], search + ',scope="FromLeader"', scrape, 2.0)
    lines += [f"# HELP {m['requests']} count of operation executed", f"# TYPE {m['requests']} counter"]
    for function, status, per_scrape in (("Search", "success", 20), ("Search", "fail", 1), ("Insert", "success", 5)):
        lines.append(f'{m["requests"]}{{node_id="1",{label["function"]}="{function}",{label["status"]}="{status}"}} '
                     f"{per_scrape * scrape}")
    lines += [f"# HELP {m['entities']} number of entities which can be searched/queried",
              f"# TYPE {m['entities']} gauge",
              f'{m["entities"]}{{node_id="1",{label["collection"]}="451",partition_id="452",segment_state="Sealed",'
              f'indexed_field_count="2"}} 9767',
              f"# HELP {m['resident_memory']} Resident memory size in bytes.",
              f"# TYPE {m['resident_memory']} gauge", f"{m['resident_memory']} 3.5e+08"]
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
    try:
        with LocalPrometheus(target, scrape_interval_s=1.0, extra_targets={"milvus": target}) as url:
            api = PrometheusApi(url)
            deadline = time.monotonic() + 30
            while True:  # rates need two scrapes inside the window
                checks = check_boards(api, [board], slo.TEST.window(slo.QUANTILE_WINDOW_S), job="milvus")
                if all(c.status == "ok" for c in checks) or time.monotonic() > deadline:
                    break
                time.sleep(1)
    finally:
        server.shutdown()
    assert len(checks) == sum(len(p.queries) for p in board.panels) == 5
    assert all(c.status == "ok" for c in checks), [(c.panel, c.status, c.detail) for c in checks if c.status != "ok"]
