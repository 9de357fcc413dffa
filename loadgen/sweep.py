"""A sweep: one step per offered rate (open loop) or per concurrency (closed loop), then the knee."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence

from rich.markup import escape
from rich.table import Table

from loadgen.cpu import CpuWindow
from loadgen.http_target import HttpTarget
from loadgen.report import error_reasons, target_label
from loadgen.runner import StopSignals, closed_loop, open_loop, run
from loadgen.stats import StepResult, find_knee

STAGE_METRIC = "ragheat_stage_duration_seconds"


def prometheus_stage_percentiles(prometheus_url: str, window_s: float, at: float) -> dict:
    """Per-stage P50/P90/P99/P99.9 (ms) over the last ``window_s`` before ``at``, from the service's own
    histograms as Prometheus scraped them (bucket-interpolated, so coarser than per-response timings); only the
    stages that ran in the window."""
    import httpx

    from loadgen.stats import PERCENTILES

    window = f"{max(1, int(round(window_s)))}s"
    out: dict[str, dict] = {}
    for name, q in PERCENTILES.items():
        promql = (f"histogram_quantile({q / 100}, sum by (le, stage) "
                  f"(rate({STAGE_METRIC}_bucket[{window}])))")
        body = httpx.get(prometheus_url.rstrip("/") + "/api/v1/query", params={"query": promql, "time": at},
                         timeout=10).json()
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus at {prometheus_url}: {body.get('error')}")
        for series in body["data"]["result"]:
            value = float(series["value"][1])
            out.setdefault(series["metric"].get("stage", "?"), {})[name] = value * 1000 if value == value else None
    # A stage with no observation in the window (its series exist from the start, at zero) did not run in it.
    return {stage: p for stage, p in out.items() if any(v is not None for v in p.values())}


def run_sweep(url: str, queries: Sequence[str], *, mode: str, levels: Sequence[float], duration_s: float,
              warmup_s: float, slo_ms: float, max_error_rate: float, seed: int = 0, timeout_s: float = 10.0,
              progress=None, prometheus_url: str | None = None, stop: StopSignals | None = None,
              zipf_s: float | None = None, server_pids: Sequence[int] = (), target: HttpTarget | None = None) -> dict:
    """Run every step; Ctrl-C (or SIGTERM) ends the sweep and keeps what was measured, the cut step marked
    interrupted (see StopSignals: a second press drops the requests in flight, a third raises KeyboardInterrupt).
    The handlers are in place from before the first step to the end (or, given ``stop``, for as long as the
    caller holds it), so a press stops the sweep the same way whether it lands mid-step, as a step starts or
    ends, or between steps. With ``prometheus_url``, per-stage percentiles come from Prometheus instead of the
    responses. With ``server_pids`` (the service's processes on this machine), each step records the CPU ms per
    answer of the service and of the generator, and the ceiling they put on the rate (``loadgen.cpu``).

    ``target`` (``loadgen.http_target``) is the request and its success check, ragheat's ``POST /v1/query`` by
    default. Per-stage percentiles need ragheat's stage timings (in its responses, or its histograms in
    Prometheus); a target without them gets end-to-end latency, the knee and CPU per answer, and
    ``results["notes"]`` says once what was left out."""
    target = target or HttpTarget()
    address = target.url(url)
    if server_pids:
        CpuWindow(server_pids)  # a pid that is not here fails before the first step, not after it
    steps: list[StepResult] = []
    notes: dict[str, None] = {}  # each said once, in the order found
    started = time.time()
    with stop or StopSignals() as stop:
        for level in levels:
            if stop.presses:
                break
            label = f"{level:g} req/s" if mode == "open" else f"{int(level)} clients"
            task = progress.add_task(f"step {label}", total=1.0) if progress is not None else None
            tick = (lambda f, t=task: progress.update(t, completed=f)) if progress is not None else None
            cpu = CpuWindow(server_pids) if server_pids else None
            if mode == "open":
                step = run(open_loop(address, queries, level, duration_s, warmup_s, seed=seed + len(steps),
                                     timeout_s=timeout_s, progress=tick, slo_ms=slo_ms, zipf_s=zipf_s, cpu=cpu,
                                     target=target), stop)
            else:
                step = run(closed_loop(address, queries, int(level), duration_s, warmup_s, timeout_s=timeout_s,
                                       progress=tick, slo_ms=slo_ms, zipf_s=zipf_s, seed=seed + len(steps), cpu=cpu,
                                       target=target), stop)
            if step is None:  # a press came before the step began
                break
            if progress is not None:
                progress.update(task, completed=1.0)
            if prometheus_url:
                time.sleep(min(5.0, step.duration_s / 4))  # let a scrape after the step land
                _stages_from_prometheus(step, prometheus_url, notes)
            steps.append(step)
            if step.interrupted:
                break
        if any(s.achieved_qps for s in steps) and not any(s.stages_ms for s in steps):
            notes[f"no per-stage timings: the responses carry no ragheat 'stages' list"
                  f"{'' if prometheus_url else ' (nor was --prometheus given)'}, so the report has end-to-end "
                  "latency only; the knee, end-to-end percentiles and CPU per answer are unaffected"] = None
        results = {
            "url": url, "target": target.describe(), "mode": mode, "slo_ms": slo_ms, "max_error_rate": max_error_rate,
            "duration_s": duration_s, "warmup_s": warmup_s, "started_at": started,
            "interrupted": len(steps) < len(levels) or any(s.interrupted for s in steps),
            "knee_qps": find_knee(steps, slo_ms, max_error_rate) if mode == "open" else None,
            # With a load controller stepping the quality ladder down, the latency knee is the floor's: the rate
            # every answer is still a full one is this (None when the responses name no rung).
            "full_quality_knee_qps": (find_knee(steps, slo_ms, max_error_rate, full_quality=True)
                                      if mode == "open" and any(s.levels for s in steps) else None),
            "steps": [s.to_json() for s in steps],
            "zipf_s": zipf_s,  # queries drawn from a Zipf law of this exponent (None: in order)
            "notes": list(notes),
        }
    return results


def _stages_from_prometheus(step: StepResult, prometheus_url: str, notes: dict[str, None]) -> None:
    """Replace the step's per-stage percentiles by Prometheus's; keep the responses' (and note why, once) when
    Prometheus has no ragheat stage histograms, as for a target that is not ragheat, or cannot be read."""
    import httpx

    try:
        stages = prometheus_stage_percentiles(prometheus_url, step.duration_s, time.time())
    except (httpx.HTTPError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        notes[f"per-stage percentiles could not be read from Prometheus at {prometheus_url} ({exc}); "
              "they come from the responses, where there are any"] = None
        return
    if stages:
        step.stages_ms, step.stages_source = stages, "prometheus"
    elif step.achieved_qps:
        notes[f"Prometheus at {prometheus_url} returned no {STAGE_METRIC} samples for a step (the target "
              "exports no ragheat stage histograms, or was not scraped during the step): per-stage percentiles "
              "come from the responses, where there are any"] = None


def sweep_and_report(out_dir: Path, url: str, queries: Sequence[str], *,
                     after_sweep: Callable[[dict], None] | None = None, **options) -> tuple[dict, Path, Path]:
    """run_sweep, then results.json and report.html in ``out_dir``, all under one StopSignals: a press once the
    sweep has stopped (the second Ctrl-C of an impatient user) waits for both files instead of leaving none, or
    aborting the interpreter inside matplotlib's import. A third press still raises KeyboardInterrupt.
    ``after_sweep`` adds to the results before they are written (``ragheat bench`` explains the steps past the
    knee there)."""
    from loadgen.report import render_report

    with StopSignals() as stop:
        results = run_sweep(url, queries, stop=stop, **options)
        if after_sweep is not None:
            after_sweep(results)
        path = write_results(results, out_dir)
        return results, path, render_report(path)


def write_results(results: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


def results_table(results: dict) -> Table:
    table = Table(title=f"{results['mode']}-loop sweep against {target_label(results)} "
                        f"(SLO P99 <= {results['slo_ms']:g} ms)")
    first = "offered req/s" if results["mode"] == "open" else "clients"
    cached = any(step.get("cache_hit_rate") is not None for step in results["steps"])  # the service has a cache
    cpu = any(step.get("cpu_ms_per_answer") for step in results["steps"])  # --server-pid was given
    why = any(step.get("error_reasons") for step in results["steps"])
    for column in (first, "achieved", "goodput", "errors", "shed", "refusal P99 ms", "P50 ms", "P90 ms", "P99 ms",
                   "P99.9 ms", "send err P99 ms", "SLO") + (("cache hits",) if cached else ()) + (
                   ("CPU ms/answer svc + gen", "CPU ceiling req/s") if cpu else ()):
        table.add_column(column, justify="right")
    if why:
        table.add_column("errors by reason", justify="left")
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for step in results["steps"]:
        lat = step["latency_ms"]
        allowed = results["max_error_rate"]
        meets = (lat["p99"] is not None and lat["p99"] <= results["slo_ms"] and step["error_rate"] <= allowed
                 and step.get("shed_rate", 0.0) <= allowed)
        level = step["offered_qps"] if results["mode"] == "open" else step["concurrency"]
        table.add_row(f"{level:g}" + (" (cut)" if step["interrupted"] else ""), f"{step['achieved_qps']:.1f}",
                      f"{step.get('goodput_qps', 0.0):.1f}", f"{step['error_rate'] * 100:.2f}%",
                      f"{step.get('shed_rate', 0.0) * 100:.2f}%", fmt((step.get("refusal_ms") or {}).get("p99")),
                      fmt(lat["p50"]), fmt(lat["p90"]), fmt(lat["p99"]),
                      fmt(lat["p99.9"]), fmt(step["send_error_ms"].get("p99")), "yes" if meets else "no",
                      *([_percent(step.get("cache_hit_rate"))] if cached else []),
                      *(_cpu_cells(step.get("cpu_ms_per_answer") or {}) if cpu else []),
                      *([escape(error_reasons(step)) or "-"] if why else []))
    return table


def _cpu_cells(cpu: dict) -> list[str]:
    if not cpu:
        return ["-", "-"]
    ceiling = cpu.get("ceiling_qps")
    return [f"{cpu['service']:.2f} + {cpu['generator']:.2f}", "-" if ceiling is None else f"{ceiling:.0f}"]


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"
