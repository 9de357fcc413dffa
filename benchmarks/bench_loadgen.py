"""How much load the generator itself can offer: open loop against a trivial endpoint.

    .venv/bin/python benchmarks/bench_loadgen.py --rates 500,1000,2000,3000 --duration 5

A separate process serves POST /v1/query with an immediate 200 (aiohttp, one event loop), so what
limits the numbers is the generator: for each offered rate it prints achieved req/s, errors, the
send-time error (actual minus intended send time: how late the generator fired) and latency. Writes
benchmarks/results/loadgen.json (--json elsewhere).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from loadgen.arrivals import parse_rates
from loadgen.resultsfile import BenchmarkRun
from loadgen.runner import open_loop, run
from rag.childproc import free_port, wait_until_ok

TRIVIAL_SERVER = """
import sys
from aiohttp import web
async def handle(request):
    await request.read()
    return web.Response(body=b'{"stages": []}', content_type="application/json")
async def ok(request):
    return web.Response(text="ok")
app = web.Application()
app.router.add_post("/v1/query", handle)
app.router.add_get("/readyz", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="500,1000,2000,3000")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/loadgen.json)")
    args = parser.parse_args()
    run_record = BenchmarkRun("loadgen")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", TRIVIAL_SERVER, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ok(url + "/readyz", 30, lambda: server.poll() is None, "trivial server")
        rows = []
        for rate in parse_rates(args.rates):
            step = run(open_loop(url + "/v1/query", ["q"], rate, args.duration, args.warmup,
                                         want_stages=False))
            rows.append({"offered": rate, "achieved": round(step.achieved_qps, 1), "errors": step.errors,
                         "send_error_ms": {k: round(v, 3) for k, v in step.send_error_ms.items()},
                         "latency_ms": {k: round(v, 3) for k, v in step.latency_ms.items()}})
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(10)
    results = {"duration_s": args.duration, "warmup_s": args.warmup, "target": "trivial aiohttp endpoint",
               "steps": rows}
    print(f"wrote {run_record.write(results, args.json)}")


if __name__ == "__main__":
    main()
