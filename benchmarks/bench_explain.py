"""The fault matrix of ``ragheat explain``: a live ``ragheat serve`` under constant open-loop load, scraped by a real
Prometheus; each fault is injected in turn, after quiet seconds that serve as its baseline, and ``explain`` is run
every few seconds from the fault's start until its top cause is the right one (or the fault's time is up).

    .venv/bin/python benchmarks/bench_explain.py --index data/index/scifact --queries datasets/scifact/queries.jsonl

The service retrieves with dense, BM25 and the graph (its embedded store), without a language model:

- ``none``: nothing injected; the explanation must say nothing is wrong (any cause is a false alarm).
- ``cpu_hog``: one process spinning per core beside the service -> ``cpu_neighbour``.
- ``overload``: the offered load multiplied past the knee -> ``overload``.
- ``gil_hog``: a thread spinning in Python inside the service (loaded through ``sitecustomize``: the service's own
  code knows nothing of it) -> ``cpu_in_process``.
- ``graph_slow``: the graph store's process stopped for part of every second (SIGSTOP/SIGCONT) -> ``graph_store``.
- ``cold_cache``: the service's memory cgroup (it starts in one, its index files evicted from the page cache
  first, so the pages it maps are charged to it) capped below what it uses: the kernel reclaims the reranker's
  token vectors it maps and it reads them back from the disk, a too tight container limit -> ``memory`` (or ``io``,
  the re-reads). Needs root.
- ``memory``: a neighbour holding all the host's free memory but a few GiB since before the baseline, then taking
  the rest but a few hundred MiB: the page cache the service runs from (its code, its libraries) is reclaimed and
  faulted back -> ``memory``.
- ``disk_writes``: a neighbour writing to the disk and syncing every megabyte. No stage of the request path writes
  to the disk, so the service must not slow down for it: the explanation must say nothing is wrong, or, if the
  service did slow, name the disk (``io``).

Then, when the matrix has any of them, a second service answers with a language model (a tiny random-weight Llama
built locally, served by vLLM on the CPU):

- ``none_llm``: nothing injected, with the model answering (false alarms with a model in the path).
- ``llm_slow``: the model server's processes stopped for part of every second -> ``language_model``.
- ``llm_stopped``: the model server stopped (it accepts connections and never answers) -> ``language_model``.

Per fault and run: the verdict and the ranked causes at the end of the fault's window, top-1 and top-2 correctness,
and the seconds from the fault's start to the first correct explanation.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

from dashboards.boards import latency_board  # noqa: E402
from dashboards.promapi import PrometheusApi  # noqa: E402
from dashboards.slo import PRODUCTION  # noqa: E402
from dashboards.snapshot import snapshot  # noqa: E402
from explain.causes import explain  # noqa: E402
from explain.report import as_json, render  # noqa: E402
from explain.signals import Span, gather  # noqa: E402
from loadgen.faults import (CpuHog, DiskWriter, InProcessSpinner, MemoryCgroup, MemoryHog, OpenLoop,  # noqa: E402
                            Paused, descendants_named, evict_page_cache, wait_until)
from loadgen.resultsfile import BenchmarkRun  # noqa: E402
from rag.childproc import free_port  # noqa: E402
from stack.prometheus import LocalPrometheus  # noqa: E402
from stack.servers import ServeProcess  # noqa: E402

EXPECTED = {"none": None, "cpu_hog": "cpu_neighbour", "overload": "overload", "gil_hog": "cpu_in_process",
            "graph_slow": "graph_store", "cold_cache": "memory", "memory": "memory", "disk_writes": None,
            "none_llm": None, "llm_slow": "language_model", "llm_stopped": "language_model"}
ALSO_CORRECT = {"disk_writes": {"io"}, "cold_cache": {"io"}}
"""Causes that are right too when the service did slow (the disk is then the honest answer)."""
LLM_FAULTS = ("none_llm", "llm_slow", "llm_stopped")
OPT_IN = ("memory",)
"""Faults run only when asked for: on a virtual machine without swap, whose service holds its index in anonymous
memory, a neighbour taking the memory costs minutes and is felt by the service as the neighbour's page-fault CPU,
not as memory stalls (docs/explain.md)."""
GRAPH_STORE_PROCESS = "redis-server"
SETTLE_S = 5
"""Seconds after a fault before the next one's baseline starts: what a fault leaves behind (a queue, pages to
fault back in) drains before the quiet seconds the next one is compared with."""


@contextlib.contextmanager
def injected(fault: str, setup: "Setup", load: OpenLoop, args):
    """The fault, on while the block lasts."""
    with contextlib.ExitStack() as stack:
        if fault == "overload":
            stack.callback(setattr, load, "rate", load.rate)
            load.rate = args.overload_qps
        elif fault == "cpu_hog":
            stack.enter_context(CpuHog())
        elif fault == "gil_hog":
            stack.enter_context(setup.spinner)
        elif fault == "graph_slow":
            stores = descendants_named(setup.service.pid, GRAPH_STORE_PROCESS)
            stack.enter_context(Paused(stores, stopped_s=args.pause_s, period_s=1.0))
        elif fault == "memory":
            stack.enter_context(setup.memory_hog)
        elif fault == "cold_cache":
            stack.enter_context(setup.cgroup.limited(args.cache_keep))
        elif fault == "disk_writes":
            stack.enter_context(DiskWriter(setup.scratch))
        elif fault == "llm_slow":
            stack.enter_context(Paused([setup.model_pid], stopped_s=args.llm_pause_s, period_s=1.0, group=True))
        elif fault == "llm_stopped":
            stack.enter_context(Paused([setup.model_pid], stopped_s=1.0, period_s=1.0, group=True))
        yield


class Setup:
    """What the faults act on: the service, the spinner inside it, the memory hog, the model server."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.service: ServeProcess | None = None
        self.spinner: InProcessSpinner | None = None
        self.memory_hog: MemoryHog | None = None
        self.cgroup: MemoryCgroup | None = None
        self.model_pid: int | None = None


def explained(api: PrometheusApi, window_s: int, at: float, printed: bool = False) -> dict:
    """The explanation as JSON; with ``printed``, also as ``ragheat explain`` prints it (key ``printed``)."""
    explanation = explain(gather(api, None, Span(window_s), Span(window_s, window_s), at=at))
    result = as_json(explanation)
    if printed:
        console = Console(file=io.StringIO(), width=118, color_system=None)
        render(explanation, console)
        result["printed"] = console.file.getvalue()
    return result


def picture(api: PrometheusApi, path: Path, start: float, end: float, scrape_s: float) -> str:
    """The latency board's heatmaps over ``start``..``end`` (what an engineer paged would open), as a PNG; its rates
    over three scrapes (a rate needs two samples)."""
    rate_window = f"{max(3, round(3 * scrape_s))}s"
    result = snapshot(api, (latency_board(PRODUCTION),), path.parent, (end - start) / 60, rate_window,
                      step_s=scrape_s, end=end)
    if not result.written:
        return ""
    result.written[0].replace(path)
    return str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


def judged(fault: str, result: dict) -> tuple[bool, bool]:
    """(top-1, top-2) correctness of one explanation of ``fault``."""
    expected = EXPECTED[fault]
    right = ({expected} if expected else set()) | ALSO_CORRECT.get(fault, set())
    kinds = [c["kind"] for c in result["causes"]]
    quiet_and_ok = expected is None and result["verdict"] == "ok"
    return (quiet_and_ok or bool(kinds) and kinds[0] in right), (quiet_and_ok or any(k in right for k in kinds[:2]))


def drill(fault: str, setup: Setup, load: OpenLoop, api: PrometheusApi, args, pictures: Path | None = None) -> dict:
    """One fault: quiet baseline, the fault with explanations every ``--every-s``, then quiet recovery."""
    if fault == "memory":  # the free memory taken before the baseline: its CPU is not the fault's
        setup.memory_hog = MemoryHog(args.memory_leave_mib)
        setup.memory_hog.prepare()
    start = time.time() + args.window_s  # the quiet seconds before are the baseline
    wait_until(start)
    tries, first_correct = [], None
    with injected(fault, setup, load, args):
        offset = args.every_s
        while offset <= args.fault_s:
            at = start + offset
            wait_until(at + args.scrape_s)  # the sample at `at` is in
            result = explained(api, args.window_s, at)
            top1, _ = judged(fault, result)
            tries.append({"after_s": offset, "verdict": result["verdict"],
                          "causes": [c["kind"] for c in result["causes"]]})
            if top1 and first_correct is None and EXPECTED[fault] is not None:
                first_correct = offset
            if offset >= args.window_s and (first_correct is not None or EXPECTED[fault] is None):
                break
            offset += args.every_s
    ended = time.time()
    final = explained(api, args.window_s, start + min(args.window_s, args.fault_s), printed=pictures is not None)
    top1, top2 = judged(fault, final)
    expected = EXPECTED[fault]
    row = {"fault": fault, "expected": expected, "verdict": final["verdict"],
           "causes": [c["kind"] for c in final["causes"]], "headline": final["headline"],
           "p99_ms": final["p99_ms"], "baseline_p99_ms": final["baseline_p99_ms"], "top1": top1,
           "top2": top2, "false_alarm": expected is None and not top1,
           "seconds_to_correct": first_correct, "tries": tries, "explanation": final}
    # The next fault's baseline (the window before it starts) is this one's recovery; a picture shows it too.
    wait_until(time.time() + (args.window_s if pictures is not None else SETTLE_S))
    if pictures is not None:
        row["printed"] = final.pop("printed")
        row["picture"] = picture(api, pictures / f"{fault}.png", start - args.window_s, ended + args.window_s,
                                 args.scrape_s)
        if not row["picture"]:
            print(f"no picture of {fault}: the latency board's heatmaps had no data", file=sys.stderr)
    return row


def summarise(rows: list[dict]) -> dict:
    by_fault = {}
    for fault in dict.fromkeys(r["fault"] for r in rows):
        mine = [r for r in rows if r["fault"] == fault]
        times = [r["seconds_to_correct"] for r in mine if r["seconds_to_correct"] is not None]
        by_fault[fault] = {"expected": EXPECTED[fault], "runs": len(mine),
                           "top1": sum(r["top1"] for r in mine) / len(mine),
                           "top2": sum(r["top2"] for r in mine) / len(mine),
                           "false_alarms": sum(r["false_alarm"] for r in mine),
                           "median_seconds_to_correct": statistics.median(times) if times else None,
                           "max_seconds_to_correct": max(times) if times else None}
    faulty = [r for r in rows if r["expected"] is not None]
    return {"faults": by_fault,
            "top1": sum(r["top1"] for r in faulty) / len(faulty) if faulty else None,
            "top2": sum(r["top2"] for r in faulty) / len(faulty) if faulty else None,
            "false_alarms": sum(r["false_alarm"] for r in rows),
            "quiet_runs": sum(r["expected"] is None for r in rows)}


def run_matrix(faults: list[str], setup: Setup, env: dict[str, str], qps: float, args,
               model_target: str | None = None) -> list[dict]:
    """Every run of ``faults`` against one service."""
    rows = []
    with contextlib.ExitStack() as stack:
        if setup.cgroup is not None:  # the service maps index files nobody holds, in the cgroup cold_cache squeezes
            evict_page_cache((Path(args.index) / "current").resolve())
            with setup.cgroup.holding_new_children():
                setup.service = stack.enter_context(ServeProcess(args.index, env=env))
        else:
            setup.service = stack.enter_context(ServeProcess(args.index, env=env))
        extra = {"vllm": model_target} if model_target else None
        prometheus = stack.enter_context(LocalPrometheus(setup.service.url.removeprefix("http://"),
                                                         scrape_interval_s=args.scrape_s, extra_targets=extra))
        load = stack.enter_context(OpenLoop(setup.service.url, qps, args.queries))
        api = PrometheusApi(prometheus)
        time.sleep(args.window_s)  # warm-up: the first baseline starts after it
        for i in range(args.runs):
            for fault in faults:
                row = drill(fault, setup, load, api, args, args.pictures if i == 0 and args.pictures else None)
                if not setup.service.child.alive():  # a drill explains a slow service, not a dead one
                    raise SystemExit(f"the service died during run {i + 1} of {fault} (an out-of-memory kill by a "
                                     f"memory limit shows in dmesg); its log ends:\n{setup.service.child.log_tail()}")
                row["run"] = i
                rows.append(row)
                took = f", correct after {row['seconds_to_correct']} s" if row["seconds_to_correct"] else ""
                print(f"run {i + 1}/{args.runs} {fault}: {row['verdict']} {row['causes'][:3]}{took} | "
                      f"{row['headline']}", flush=True)
    return rows


def with_model(faults: list[str], setup: Setup, env: dict[str, str], args) -> list[dict]:
    """The language model's faults, against a service answering through a tiny random-weight Llama on vLLM."""
    from stack.tiny_llama import build_tiny_llama
    from stack.vllm import VllmServer

    corpus = args.queries.parent / "corpus.jsonl"
    with open(corpus, encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for _, line in zip(range(1000), fh)]
    model = build_tiny_llama(setup.scratch / "tiny-llama", texts)
    server = VllmServer(model, port=free_port(), served_name="tiny", load_format="dummy", max_model_len=2048,
                        max_num_seqs=16, work_dir=setup.scratch / "vllm")
    with server as url:
        setup.model_pid = server.child.pid
        # A deadline the random model's answers on two loaded cores cannot exhaust, so that they are written in
        # the baseline and a slow model is seen in the stages (the default deadline answers extractively at once).
        env = {**env, "RAGHEAT_GENERATION__GENERATOR": "openai", "RAGHEAT_GENERATION__BASE_URL": url,
               "RAGHEAT_GENERATION__MODEL": "tiny", "RAGHEAT_GENERATION__MAX_TOKENS": str(args.llm_max_tokens),
               "RAGHEAT_ADMISSION__DEADLINE_MS": "10000"}
        return run_matrix(faults, setup, env, args.llm_qps, args,
                          model_target=server.metrics_url.removeprefix("http://").removesuffix("/metrics"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True, help="the index `ragheat serve` serves (with its graph)")
    parser.add_argument("--queries", type=Path, required=True,
                        help="a BEIR queries.jsonl to send (its corpus.jsonl trains the tiny model's tokenizer)")
    parser.add_argument("--faults", default=",".join(f for f in EXPECTED if f not in OPT_IN),
                        help=f"comma list of {', '.join(EXPECTED)} (default: all but {', '.join(OPT_IN)})")
    parser.add_argument("--runs", type=int, default=3, help="runs of each fault")
    parser.add_argument("--window-s", type=int, default=30, help="the window explained (and its baseline)")
    parser.add_argument("--fault-s", type=int, default=60, help="the longest a fault lasts while not yet explained")
    parser.add_argument("--every-s", type=int, default=5, help="seconds between explanations during a fault")
    parser.add_argument("--scrape-s", type=float, default=5.0,
                        help="Prometheus' scrape interval (compose's and `ragheat stack up`'s)")
    parser.add_argument("--quiet-qps", type=float, default=6.0)
    parser.add_argument("--overload-qps", type=float, default=120.0)
    parser.add_argument("--pause-s", type=float, default=0.3,
                        help="graph_slow: seconds of every second the graph store is stopped")
    parser.add_argument("--llm-pause-s", type=float, default=0.6,
                        help="llm_slow: seconds of every second the model server is stopped (a CPU-served model "
                             "is slow already: a short pause hides in its own spread)")
    parser.add_argument("--cache-keep", type=float, default=0.1,
                        help="cold_cache: share of the service's page cache its cgroup's limit leaves room for")
    parser.add_argument("--memory-leave-mib", type=int, default=384,
                        help="memory: MiB of the host's available memory the neighbour leaves")
    parser.add_argument("--retrievers", default="dense,bm25,graph",
                        help="the service's retrievers (graph_slow needs the graph, and the index to have one)")
    parser.add_argument("--llm-qps", type=float, default=2.0, help="the load while a language model answers")
    parser.add_argument("--llm-max-tokens", type=int, default=16, help="tokens in a written answer (noise)")
    parser.add_argument("--pictures", type=lambda v: Path(v) if v else None,
                        default=REPO / "docs" / "images" / "explain",
                        help="the latency board's heatmaps around each fault's first run go here ('' for none)")
    parser.add_argument("--json", type=Path, help="results file (default benchmarks/results/explain.json)")
    args = parser.parse_args()
    run = BenchmarkRun("explain")
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(EXPECTED))
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(EXPECTED)})")
    if "cold_cache" in faults and os.geteuid() != 0:
        parser.error("--faults cold_cache limits the service's memory cgroup: run as root, or leave it out")
    if "graph_slow" in faults and "graph" not in args.retrievers.split(","):
        parser.error("--faults graph_slow slows the graph store: --retrievers must include graph")
    retrieval = [f for f in faults if f not in LLM_FAULTS]
    model = [f for f in faults if f in LLM_FAULTS]
    env = {**os.environ, "RAGHEAT_CACHE__ENABLED": "false",  # every request does the whole work
           "RAGHEAT_RETRIEVAL__RETRIEVERS": json.dumps(args.retrievers.split(","))}
    rows = []
    with tempfile.TemporaryDirectory(prefix="rh-explain-") as scratch:
        setup = Setup(Path(scratch))
        if retrieval:
            if "gil_hog" in retrieval:
                setup.spinner = InProcessSpinner(setup.scratch / "spinner")
            setup.cgroup = MemoryCgroup() if "cold_cache" in retrieval else None
            try:
                rows += run_matrix(retrieval, setup, setup.spinner.env(env) if setup.spinner else env,
                                   args.quiet_qps, args)
            finally:
                if setup.cgroup is not None:
                    setup.cgroup.remove()
        if model:
            rows += with_model(model, setup, env, args)
    summary = summarise(rows)
    print(f"top-1 {summary['top1']:.0%}, top-2 {summary['top2']:.0%}, false alarms {summary['false_alarms']} "
          f"of {summary['quiet_runs']} quiet runs")
    report = {"params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                         if k not in ("json", "pictures")},
              "summary": summary, "rows": rows}
    print(f"wrote {run.write(report, args.json)}")


if __name__ == "__main__":
    main()
