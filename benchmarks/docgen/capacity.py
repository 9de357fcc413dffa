"""Sections on capacity: the load generator, the SciFact service's knee, the examples' knees, admission control,
micro-batching, replicas, ANN indexes and what the eBPF probes cost."""

from __future__ import annotations

import shlex

from .stats import (blocks, bold, compare, count, duration, join_words, knee_rate, median, noise_verdict, num, opt,
                    pct, spread, table, with_range)

SEND_ERROR_TARGET_MS = 1.0  # the generator must fire within 1 ms of its schedule at P99
OFFERED_TARGET = 2000.0
SCHEDULER_BUDGET_PCT = 2.0  # the throughput the default probes may cost


def _ms1(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def _by_rate(configs: dict, key: str = "steps") -> dict[float, dict]:
    """offered rate -> configuration -> its step, for tables with a column per configuration."""
    out: dict[float, dict] = {}
    for name, conf in configs.items():
        for s in conf[key]:
            out.setdefault(s["offered_qps"], {})[name] = s
    return dict(sorted(out.items()))


def loadgen(d: dict) -> str:
    data = d["loadgen"]
    keeping = [s for s in data["steps"] if s["send_error_ms"].get("p99") is not None
               and s["send_error_ms"]["p99"] < SEND_ERROR_TARGET_MS and s["achieved"] >= 0.98 * s["offered"]
               and s["errors"] == 0]
    top = max(keeping, key=lambda s: s["offered"]) if keeping else None
    rows = []
    for s in data["steps"]:
        e, lat, strong = s["send_error_ms"], s["latency_ms"], s is top
        p99 = bold(opt(e.get("p99"), 3)) if strong else opt(e.get("p99"), 3)
        rows.append([bold(count(s["offered"])) if strong else count(s["offered"]), num(s["achieved"], 1),
                     count(s["errors"]), f"{opt(e.get('p50'), 3)} / {p99} / {opt(e.get('p99.9'), 3)}",
                     f"{opt(lat.get('p50'))} / {opt(lat.get('p99'))}"])
    verdict = (f"Target: at least {count(OFFERED_TARGET)} req/s offered with send-time error P99 under "
               f"{SEND_ERROR_TARGET_MS:g} ms — ")
    if top is None:
        verdict += f"{bold('not met')}: no rate kept the send-time error P99 under {SEND_ERROR_TARGET_MS:g} ms."
    else:
        verdict += (f"{'met' if top['offered'] >= OFFERED_TARGET else bold('not met')}: the highest rate that kept it "
                    f"is {count(top['offered'])} req/s ({num(top['send_error_ms']['p99'], 3)} ms).")
    return f"""\
Open loop (Poisson arrivals) against a trivial aiohttp endpoint in another process, {data['duration_s']:g} s per rate
after {data['warmup_s']:g} s of warm-up. Send-time error is how late the generator fired each request against its
schedule.

{table(["offered req/s", "achieved", "errors", "send-time error P50 / P99 / P99.9 ms", "latency P50 / P99 ms"], rows,
       "rrrrr")}

{verdict} Once the generator's one core falls behind, its send-time error grows; the report shows that
column for every step so a late generator is visible rather than silently flattering. Two things made the
difference when it was built: uvloop (from uvicorn's `standard` extra) and taking every timestamp from
`perf_counter` (uvloop's `loop.time()` is libuv's cached millisecond clock, which put up to a millisecond of
error into every send time), plus sleeping on the timer only until 1.5 ms before each send and yielding to the
loop for the rest."""


KNEE_PIPELINE = """\
This is the default pipeline: the router picks each question's retrievers and whether the reranker runs
(`retrieval.retrievers` is `routed`; what it picks for SciFact's claims is in "The default: the router picks each
question's retrievers and reranker"); the answer cache and HyDE stay off. Each is
measured in its own section: what reranking costs in capacity side by side in "Replicas behind nginx" (`direct-1`
against `direct-1-no-rerank`) and in latency in "Late-interaction reranker: what it costs"; the answer cache's knee
in "Semantic answer cache"; the graph retriever in "Graph retrieval and routing". At the knee the
`embed` stage (one MiniLM run per query on one thread: "Embedding quantisation schemes side by side") is most of each
query's CPU, then `rerank`, so the machine's cores, shared with the generator, bound the rate; batching queries into
one run buys nothing on this CPU ("Micro-batched query embedding")."""


def knee(d: dict) -> str:
    data = d["knee-scifact"]
    slo, knee_qps, allowed = data["slo_ms"], data["knee_qps"], data["max_error_rate"]
    rows = []
    for s in data["steps"]:
        lat = s["latency_ms"]
        # As find_knee: P99 within the SLO, errors and shed queries each within the allowance (a shed query got no
        # answer).
        shed_rate = s.get("shed_rate", 0.0)
        meets = lat["p99"] is not None and lat["p99"] <= slo and s["error_rate"] <= allowed and shed_rate <= allowed
        is_knee = knee_qps is not None and s["offered_qps"] == knee_qps
        offered = count(s["offered_qps"]) + (" (cut)" if s["interrupted"] else "")
        stages, cpu = s.get("stages_ms") or {}, s.get("cpu_ms_per_answer") or {}
        rows.append([bold(offered) if is_knee else offered, num(s["achieved_qps"], 1),
                     *(opt(lat[k]) for k in ("p50", "p90", "p99", "p99.9")),
                     f"{count(s.get('shed', 0))} ({shed_rate * 100:.1f} %)", opt((stages.get("embed") or {}).get("p50")),
                     opt((stages.get("rerank") or {}).get("p50")),
                     f"{num(cpu['service'], 1)} + {num(cpu['generator'], 1)}" if cpu else "–",
                     opt(cpu.get("ceiling_qps"), 0) if cpu else "–", opt(s["send_error_ms"].get("p99")),
                     bold("yes (knee)") if is_knee else ("yes" if meets else "no")])
    sends = [s["send_error_ms"]["p99"] for s in data["steps"] if s["send_error_ms"].get("p99") is not None]
    service = data.get("service") or {}
    served = (f"{count(service['chunks'])} chunks of {service.get('corpus', '?')}" if service.get("chunks")
              else "the SciFact index")
    columns = ["offered req/s", "answered", "P50 ms", "P90 ms", "P99 ms", "P99.9 ms", "shed", "embed P50 ms",
               "rerank P50 ms", "CPU ms/answer service + generator", "CPU ceiling req/s", "send err P99 ms",
               f"meets the SLO (P99 ≤ {slo:g} ms, ≤ {allowed * 100:g} % errors and shed)"]
    return f"""\
The service answered from {served}, with default telemetry on; {data['duration_s']:g} s per rate after
{data['warmup_s']:g} s of warm-up.

{table(columns, rows, "rrrrrrrrrrrrl")}

Knee (the highest offered rate whose P99 meets {slo:g} ms, every lower rate meeting it too): \
{bold(f"{count(knee_qps)} req/s") if knee_qps is not None else bold("none of the offered rates")}, the service and the
generator sharing the machine's cores. The CPU columns say why: the CPU time the service and the generator spent per
answer (`ragheat bench --server-pid`, from `/proc`; past the knee the refusals' cost is in it), and the answers per
second at which that cost fills every core, a ceiling no queueing or admission policy can pass on this machine; the
knee sits below it because waiting grows without bound as the cores fill. Latencies count from each request's
intended send time, so queueing past the knee shows in full. The generator's send-time error P99 ranged over
{f"{num(min(sends))}–{num(max(sends))} ms" if sends else "not recorded"} here, more than against the trivial endpoint
because the service saturates the cores.

{KNEE_PIPELINE}"""


EXAMPLE_NAMES = {"haystack": "Haystack", "llama_index": "LlamaIndex", "langchain": "LangChain"}
STAGE_ORDER = ("embed", "link_entities", "route", "retrieve", "retrieve_dense", "retrieve_bm25", "retrieve_graph",
               "fuse", "rerank", "generate")


def _in_order(stages: dict) -> dict:
    """Stages in pipeline order, any others after them by name."""
    return dict(sorted(stages.items(), key=lambda kv: (STAGE_ORDER.index(kv[0]) if kv[0] in STAGE_ORDER
                                                        else len(STAGE_ORDER), kv[0])))


def _meets(s: dict, slo: float, allowed: float) -> bool:
    """As find_knee: P99 within the SLO, errors and shed queries each within the allowance."""
    p99 = s["latency_ms"].get("p99")
    return p99 is not None and p99 <= slo and s["error_rate"] <= allowed and (s.get("shed_rate") or 0.0) <= allowed


def _stage_p99s(steps: list[dict]) -> dict[str, list[float]]:
    """stage -> its P99 in each of ``steps`` (the rounds' steps at one rate) where it was measured."""
    out: dict[str, list[float]] = {}
    for s in steps:
        for stage, p in (s.get("stages_ms") or {}).items():
            if p.get("p99") is not None:
                out.setdefault(stage, []).append(p["p99"])
    return _in_order(out)


def _p99_floor(p: dict) -> str:
    """A P99 from scraped buckets; ``≥`` when it fell past the highest finite edge."""
    return ("≥ " if "p99" in p.get("above_top", ()) else "") + num(p["p99"], 1)


def _knee_verdict(name: str, knees: list, top: float, duration_s: float) -> str:
    """What the rounds say about one example's knee, and whether they agree."""
    found = [k for k in knees if k is not None]
    if not found:
        return f"{name}: no offered rate met the SLO in any round."
    low, high, n = min(found), max(found), len(knees)
    above = f"the highest rate offered, {knee_rate(top)} req/s, met the SLO, so the knee may lie above it"
    if n == 1:
        return (f"{name}: {knee_rate(low)} req/s from a single sweep, so there is no spread to judge it by"
                + (f"; {above}." if high >= top else "."))
    every = "both sweeps" if n == 2 else f"every one of the {n} sweeps"
    if len(set(knees)) == 1:
        return f"{name}: {every} put the knee at {knee_rate(low)} req/s" + (f"; {above}." if high >= top else ".")
    return (f"{name}: the {n} sweeps put the knee at {', '.join(knee_rate(k) for k in knees)} req/s: steps of "
            f"{duration_s:g} s are noisier than the rate grid here, so the knee is only known to be "
            + (f"at least {knee_rate(low)} req/s ({above})." if high >= top
               else f"between {knee_rate(low)} and {knee_rate(high)} req/s."))


def _comparison(knees: dict[str, list]) -> str:
    """Which examples' knees differ by more than their rounds' spread."""
    spans = {name: (min(k), max(k)) for name, ks in knees.items() if (k := [v for v in ks if v is not None])}
    ordered = sorted(spans, key=lambda n: spans[n])
    if len(ordered) < 2:
        return ""
    if max(len(ks) for ks in knees.values()) < 2:
        order = ordered[0] + "".join(f" {'=' if spans[a] == spans[b] else '<'} {b}" for a, b in zip(ordered, ordered[1:]))
        return f"One sweep each: the order of their knees, {order}, has no spread across rounds to be judged by."
    return "; ".join(f"{low} and {high} cannot be told apart by this run (their knees' ranges across rounds overlap)"
                     if spans[low][1] >= spans[high][0] else f"{high}'s knee is above {low}'s in every round"
                     for low, high in zip(ordered, ordered[1:])) + "."


def _cpu(steps: list[dict], part) -> str:
    return _over_rounds([part(c) for s in steps if (c := s.get("cpu_ms_per_answer"))], lambda v: num(v, 1))


def examples(d: dict) -> str:
    from .page import wrap_command  # the page imports this module: read at call time

    e = d["examples"]
    slo, allowed, top, cores = e["slo_ms"], e["max_error_rate"], max(e["rates"]), e["cores"]
    rows, summary, verdicts, knees, busy, fewest = [], [], [], {}, [], None
    for key, f in e["frameworks"].items():
        name, rounds = EXAMPLE_NAMES.get(key, key), f["rounds"]
        knees[name] = [r["knee_qps"] for r in rounds]
        by_rate: dict[float, list[dict]] = {}  # offered rate -> its step in each round
        for r in rounds:
            for s in r["steps"]:
                by_rate.setdefault(s["offered_qps"], []).append(s)
        for i, (rate, steps) in enumerate(sorted(by_rate.items())):
            reasons = sorted({reason for s in steps for reason in (s.get("error_reasons") or {})})
            rows.append([bold(name) if i == 0 else "", f"{rate:g}",
                         *(with_range([s[k] for s in steps], lambda v: num(v, 1)) for k in ("achieved_qps",
                                                                                          "goodput_qps")),
                         *(_over_rounds([s["latency_ms"].get(k) for s in steps]) for k in ("p50", "p99")),
                         count(sum(s["errors"] for s in steps)) + (f" ({', '.join(reasons)})" if reasons else ""),
                         f"{_cpu(steps, lambda c: c['service'])} + {_cpu(steps, lambda c: c['generator'])}",
                         _over_rounds([c.get("ceiling_qps") for s in steps if (c := s.get("cpu_ms_per_answer"))],
                                      lambda v: num(v, 0)),
                         " · ".join(f"{st} {num(median(v), 1)}" for st, v in _stage_p99s(steps).items()) or "–",
                         " · ".join(bold("yes (knee)") if r["knee_qps"] == rate else
                                    "yes" if _meets(s, slo, allowed) else "no" for r, s in zip(rounds, steps))])
            if (offered := min(s["requests"] for s in steps)) and (fewest is None or offered < fewest[1]):
                fewest = (rate, offered)
        sure = min((k for k in knees[name] if k is not None), default=None)  # every round met the SLO up to here
        at, past = by_rate.get(sure, []), by_rate.get(min((r for r in by_rate if sure is not None and r > sure),
                                                          default=None), [])
        stages = _stage_p99s(at)
        slowest = max(stages, key=lambda st: median(stages[st])) if stages else None
        whole = _in_order(f["stages_ms"])
        summary.append([
            bold(name), ", ".join(f"`{st}`" for st in whole) or "–", duration(f["start_s"]),
            ", ".join(knee_rate(k) for k in knees[name]),
            "–" if not at else f"{knee_rate(sure)} req/s: P99 {_over_rounds([s['latency_ms'].get('p99') for s in at])}"
            f" · CPU {_cpu(at, lambda c: c['service'] + c['generator'])} · ceiling "
            f"{_over_rounds([c.get('ceiling_qps') for s in at if (c := s.get('cpu_ms_per_answer'))], count)}"
            + (f" · `{slowest}` {num(median(stages[slowest]), 1)}" if slowest else ""),
            " · ".join(f"{st} {_p99_floor(p)}" for st, p in whole.items()) or "–",
            _p99_floor(f["request_ms"]) if f.get("request_ms") else "–"])
        verdicts.append(_knee_verdict(name, knees[name], top, e["duration_s"]))
        used = [s["achieved_qps"] * (c["service"] + c["generator"]) / 1000 for s in past
                if (c := s.get("cpu_ms_per_answer"))]
        if used:
            busy.append((name, past[0]["offered_qps"], used))
    key, first = next(iter(e["frameworks"].items()))
    service = [w.replace(f"examples.{key}.", "examples.FRAMEWORK.") for w in first["service_argv"]]
    commands = (wrap_command(shlex.join(service)) + f" &    # FRAMEWORK: {', '.join(e['frameworks'])}, in turn\n"
                + wrap_command(shlex.join(first["rounds"][0]["argv"])) + "    # --seed: the round, from 0")
    swept = {1: "once", 2: "twice"}.get(e["rounds"], f"{e['rounds']} times")
    cores_used = "; ".join(f"{name} at {knee_rate(rate)} req/s, {with_range(used)}" for name, rate, used in busy)
    full = all(max(used) < 0.8 * cores for _, _, used in busy)
    return blocks(
        f"""\
The three services of `examples/`, each built from its framework's own components: BM25 and all-MiniLM-L6-v2 dense
retrieval (run by sentence-transformers on PyTorch, not ragheat's ONNX model) over the first {count(e['docs'])}
SciFact abstracts, fused by reciprocal rank, behind FastAPI as `POST /query {{"question": ...}}`. None calls a
language model: the answer is the text of the best fused passage, so these are retrieval services, and their
knees are no measure of a generating RAG service. Each runs as its form (i), `ragheat.observe`'s middleware and
its framework's hook (every component a stage), under uvicorn's defaults, one at a time: it shares the machine's
{count(cores)} cores with the load generator (and with the other processes of the line above). Each is swept
{swept} as a user would sweep it (open loop, Poisson arrivals drawn anew each round, SciFact claims,
{e['duration_s']:g} s per rate after {e['warmup_s']:g} s of warm-up, latency from the intended send time), with a
local Prometheus scraping it every second; between sweeps the service finishes its backlog first:""",
        f"```bash\n{commands}\n```",
        table(["example", "stages (its own /metrics)", "start-up", "knee req/s per round",
               "at the lowest knee: P99 ms · CPU ms per answer, service + generator · CPU ceiling req/s · slowest "
               "stage, P99 ms", "stage P99 ms over all sweeps (/metrics)", "`/query` P99 ms (/metrics)"], summary,
              "llrrlll",
              f"Knee: the highest offered rate whose P99 meets {slo:g} ms with errors ≤ {allowed * 100:g} %, every "
              "lower rate meeting it too. Start-up: from the process's start to its first answer at `/metrics`, "
              "embedding the abstracts included. The last two columns come from the service's own histograms "
              "(`ragheat_stage_duration_seconds`, `ragheat_request_duration_seconds`) scraped before and after the "
              "sweeps, interpolated as `histogram_quantile` does (≥: past the highest finite bucket edge): every "
              "request of every sweep, warm-ups and the steps past the knee included, so they show where the waiting "
              "lands more than what a stage costs."),
        table(["example", "offered req/s", "answered req/s", "goodput req/s", "P50 ms", "P99 ms", "errors",
               "CPU ms/answer service + generator", "CPU ceiling req/s", "stage P99 ms (Prometheus, per step)",
               "meets the SLO, per round"], rows, "lrrrrrrrrll",
              "Per step: the median over rounds (lowest–highest round; the stages' P99s, the median alone). Goodput: answers within the SLO per second. "
              "CPU: the service's and the generator's CPU time per answer (`--server-pid`, from `/proc`) and the "
              "answers per second at which it fills every core. Stage P99: from the service's histograms as "
              "Prometheus scraped them over the step (`ragheat bench --prometheus`), bucket-interpolated."),
        "\n".join(f"- {v}" for v in verdicts + [_comparison(knees)] if v),
        f"Cores the service and the generator kept busy at the first rate past each lowest knee (answers per second "
        f"× CPU per answer): {cores_used}, of {count(cores)}." + (
            " Each misses the SLO with its cores far from full: what runs out first is not the machine's CPU, and "
            "the per-step stage column shows in which stage the requests wait." if full else "") if busy else "",
        f"""\
How far to trust a step: a step offers about rate × duration requests, so at {knee_rate(fewest[0])} req/s a round
held as few as {count(fewest[1])}{", and its P99 is close to its slowest answer" if fewest[1] < 100 else ""}; one
slow answer there moves the P99 more than a rate step does. Past the knee latency grows for as long as the step
lasts (no admission control: every request waits for a worker thread); one that outlasts the generator's timeout is
an error. ragheat's own service is measured the same way in "The knee of the SciFact service".""" if fewest else "")


def _over_rounds(values: list, fmt=_ms1) -> str:
    """``M (L–H)`` over rounds (values not measured left out), or the single value."""
    values = [v for v in values if v is not None]
    return "–" if not values else with_range(values, fmt)


def capacity(d: dict) -> str:
    c = d["capacity"]
    configs, slo, reference = c["configs"], f"{c['slo_ms']:g}", c["reference_knee_qps"]
    knees = []
    for name, conf in configs.items():
        steps = {s["offered_qps"]: s for s in conf["knee_steps"]}
        cells = "; ".join(f"{rate:g}: {_ms1(s['latency_ms'].get('p99'))}"
                          + (f" (shed {s['shed_rate'] * 100:.0f} %)" if s["shed"] else "")
                          for rate, s in sorted(steps.items()))
        cpu = (steps.get(conf["knee_qps"]) or {}).get("cpu_ms_per_answer") or {}
        ceiling = cpu.get("ceiling_qps")
        knees.append([name, knee_rate(conf["knee_qps"]), cells or "–",
                      f"{cpu['service']:.1f} + {cpu['generator']:.1f} ({'–' if ceiling is None else f'{ceiling:.0f}'})"
                      if cpu else "–"])
    overload = []
    for phase in ("2x", "4x burst"):
        for name, conf in configs.items():
            steps = [s for s in conf["overload"] if s["phase"] == phase]
            if not steps:
                continue
            goodput = [s["goodput_qps"] for s in steps]
            reasons: dict[str, int] = {}
            for s in steps:
                for reason, n in s["shed_reasons"].items():
                    reasons[reason] = reasons.get(reason, 0) + n
            overload.append([
                phase, f"{steps[0]['offered_qps']:g}", name, _over_rounds([s["latency_ms"].get("p99") for s in steps]),
                _over_rounds(goodput) + (f" ({median(goodput) / reference:.2f}× knee)" if reference else ""),
                _over_rounds([s["shed_rate"] * 100 for s in steps], lambda v: f"{v:.0f} %")
                + (f" ({', '.join(f'{r} {n}' for r, n in reasons.items())})" if reasons else ""),
                _over_rounds([s["refusal_ms"].get("p50") for s in steps]) + " / "
                + _over_rounds([s["refusal_ms"].get("p99") for s in steps]),
                _over_rounds([s["refusal_server_ms"].get("p99") for s in steps], lambda v: f"{v:.2f}"),
                str(sum(s["errors"] for s in steps))])
    return blocks(
        table(["admission", "knee req/s", "P99 ms per offered rate",
               "CPU ms per answer at the knee: service + generator (ceiling req/s)"], knees, "lrlr",
              f"Knee: the highest offered rate with P99 ≤ {slo} ms, errors and shed queries ≤ "
              f"{c['max_error_rate'] * 100:g} %, every lower rate meeting it too"),
        table(["step", "offered req/s", "admission", "P99 ms (answered)", "goodput req/s", "shed",
               "refusal P50 / P99 ms (client)", "refusal P99 ms (service)", "errors"], overload, "lrlrrrrrr",
              f"Overload: admitted P99, goodput, shed queries and refusal latency. Admission on = the defaults (bounded "
              f"in-flight queries and queue, deadline = the SLO, worker threads at a lower priority than the event "
              f"loop: admission.worker_nice); on-nice-0 = the same with the workers at the event loop's priority; off = "
              f"every query queued. The overload steps offer multiples of admission-on's knee ({reference:g} req/s). "
              f"P99 is of answered queries only; goodput = answers within {slo} ms per second; refusal = the latency "
              f"of a query shed at once (queue_full, deadline; expired ones waited until their deadline), as the "
              f"client saw it (loopback and the generator's own scheduling included) and as the service timed it "
              f"(arrival stamp to decision, its Server-Timing header); errors = failures and timeouts ({c['rounds']} "
              f"round(s), median (low–high) when more; load average {c['load_average_before'][0]:.2f} before, "
              f"{c['load_average_after'][0]:.2f} after)."))


def _p50_p99(s: dict) -> str:
    return f"{_ms1(s['latency_ms'].get('p50'))} / {_ms1(s['latency_ms'].get('p99'))}"


def _errors(s: dict) -> str:
    return f", {s['errors']} errors" if s["errors"] else ""


def _saturated(conf: dict) -> str:
    """Where the sweep stopped offering a configuration more: its last step."""
    if not conf["stopped"] or not conf["steps"]:
        return "–"
    s = conf["steps"][-1]
    return f"at {s['offered_qps']:g} req/s (P99 {_ms1(s['latency_ms'].get('p99'))} ms, errors {s['error_rate']:.1%})"


def batching(d: dict) -> str:
    b = d["batching"]
    configs = b["configs"]
    rows = [[f"{rate:g}", *("not offered (saturated)" if s is None else
                            f"{_p50_p99(s)} ({s['achieved_qps']:.0f}/s; embed {_ms1(s['embed_p50_ms'])}, queue "
                            f"{_ms1(s['queue_p50_ms'])}){_errors(s)}" + (f", {s['shed']} shed" if s["shed"] else "")
                            for s in (steps.get(name) for name in configs))]
            for rate, steps in _by_rate(configs).items()]
    knees, quiet = [], []
    for name, conf in configs.items():
        knees.append([name, conf["query_batch_max"], f"{conf['query_batch_wait_ms']:g}", conf["query_batch_runs"],
                      knee_rate(conf["knee_qps"]), _saturated(conf)])
        p50s, p99s = ([s["latency_ms"].get(k) for s in conf["concurrency1"] if s["latency_ms"].get(k) is not None]
                      for k in ("p50", "p99"))
        quiet.append([name, _ms1(median(p50s)) if p50s else "–", _ms1(median(p99s)) if p99s else "–",
                      f"{min(p99s):.1f}–{max(p99s):.1f}" if p99s else "–", len(p99s)])
    return blocks(
        """Queries that arrive while every embedding run slot is busy can share one ONNX run (`embedding.query_batch_max`,
`query_batch_runs`, `query_batch_wait_ms`); a query that finds a free slot never waits, and the wait for a shared
run is reported in the `queue` stage, not in `embed`. The configurations are measured side by side, in rotation, on
one index: batching off, and each window with one or two run slots.""",
        table(["offered req/s", *configs], rows, "r" * (len(configs) + 1), "P50 / P99 latency in ms (answered req/s; "
              "median embed and queue stage, ms), per offered rate"),
        table(["configuration", "max batch", "wait ms", "runs", "knee req/s", "stopped"], knees, "lrrrrl",
              f"Knee: the highest offered rate with P99 ≤ {b['slo_ms']:g} ms and errors ≤ "
              f"{b['max_error_rate'] * 100:g} %, every lower rate meeting it too"),
        table(["configuration", "P50", "P99", "P99 range", "rounds"], quiet, "lrrrr",
              "Concurrency 1 (one closed-loop client): latency in ms, median of rounds and spread of P99"))


def _last_offered(conf: dict) -> str:
    """Where each round stopped offering more: its last step's rate, P99 and shed share."""
    if not conf["stopped"]:
        return "–"
    return "; ".join("–" if not steps else f"{steps[-1]['offered_qps']:g}/s (P99 "
                     f"{_ms1(steps[-1]['latency_ms'].get('p99'))} ms, {steps[-1].get('shed_rate', 0) * 100:.0f} % shed)"
                     for steps in conf["rounds"])


def replicas(d: dict) -> str:
    r = d["replicas"]
    configs = r["configs"]
    rows = [[f"{rate:g}", *("not offered (saturated)" if s is None else f"{_p50_p99(s)} ({s['achieved_qps']:.0f}/s"
                            f"{_errors(s)}" + (f", {s['shed']} shed)" if s.get("shed") else ")")
                            for s in (steps.get(name) for name in configs))]
            for rate, steps in _by_rate(configs).items()]
    knees = [[name, knee_rate(conf["knee_qps"]), ", ".join(knee_rate(k) for k in conf["knees_qps"]), _last_offered(conf)]
             for name, conf in configs.items()]
    return blocks(
        """One `ragheat serve` answering directly (`direct-1`, the default pipeline, reranking on), the same with reranking
off (`direct-1-no-rerank`, when the run has it: what the default-on rerank stage costs in capacity), one
`ragheat serve --workers 2` (`workers-2`: two worker processes on one port, SO_REUSEPORT, no proxy), the first replica
behind nginx (`nginx-1`: the proxy's own cost) and two replicas behind nginx (`nginx-2`, `least_conn`, keepalive to
the replicas: the config of `ragheat stack up --replicas 2`), each rate offered to each in turn (open loop, Poisson
arrivals, latency from the intended send time), the whole sweep repeated `--rounds` times with the order rotated. The
processes, nginx and the load generator share the machine's cores, so a second process competes with the first for
them; each process admits its own `admission.max_in_flight` queries, so two processes admit twice as many.""",
        table(["offered req/s", *configs], rows, "r" * (len(configs) + 1), "P50 / P99 latency in ms (achieved req/s), "
              f"per offered rate{' (the first round)' if r['rounds'] > 1 else ''}"),
        table(["configuration", "knee req/s", "per round", "last rate offered, per round"], knees, "lrll",
              f"Knee: the highest offered rate with P99 ≤ {r['slo_ms']:g} ms and errors and shed each ≤ "
              f"{r['max_error_rate'] * 100:g} %, every lower rate meeting it too (median of rounds)"))


def _point(points, dataset: str, index: str, search: str):
    return next((p for p in points if p["dataset"] == dataset and p["index"] == index and p["search"] == search), None)


def _cell(p) -> str:
    return "–" if p is None else f"{p['recall_at_10']:.3f} / {count(p['qps_1'])} / {num(p['p99_ms_1'])}"


ANN_REFERENCE = """\
**Against the published reference** (1 M 768-d vectors, 128 concurrent searchers on a large server: HNSW M=16
1,842 QPS / P99 63 ms; HNSW M=64 1,521 / 117 ms; IVF-PQ nlist=4096 2,105 / 48 ms; cited, not measured here):
our sets are far smaller and half the dimension, so each HNSW hop and each exact scan costs less; throughput
stops growing once the searchers outnumber the cores, after which P99 grows with the queue, which is where the
reference's 128 searchers sit. IVF-PQ's recall is capped by its 48 sub-quantisers of 8 bits on 384-d vectors
with no re-ranking (more probes add little), not by the probing; a production IVF-PQ would re-rank on exact
vectors (IndexRefineFlat)."""


def ann(d: dict) -> str:
    data = d["ann"]
    points, datasets, threads = data["points"], list(data["datasets"]), [str(t) for t in data["threads"]]
    show = {"hnsw": ("efSearch=16", "efSearch=64", "efSearch=256"), "ivfpq": ("nprobe=1", "nprobe=16", "nprobe=64")}
    families: dict[str, dict[str, str]] = {}  # "flat", "hnsw M=16", ..., "ivfpq" -> data set -> index name
    for p in points:
        families.setdefault("ivfpq" if p["index"].startswith("ivfpq") else p["index"], {})[p["dataset"]] = p["index"]
    rows = []
    for family, names in families.items():
        kind = family.split()[0]
        searches = ("exact",) if kind == "flat" else show[kind]
        values = " / ".join(s.split("=")[1] for s in searches if "=" in s)
        label = {"flat": "flat (exact)", "hnsw": f"HNSW {family.split()[-1]} efSearch {values}",
                 "ivfpq": f"IVF-PQ nprobe {values}"}[kind]
        cells = []
        for dataset in datasets:
            name = names.get(dataset)
            text = " · ".join(_cell(_point(points, dataset, name, s)) for s in searches) if name else "–"
            cells.append(text + (f" ({name.split(' ', 1)[1]})" if kind == "ivfpq" and name else ""))
        rows.append([label, *cells])
    sweep = [[p["dataset"], f"{p['index']} {p['search']}".replace(" exact", ""), num(p["build_s"], 1),
              num(p["memory_mb"], 1), *(f"{count(p['concurrency'][t]['qps'])} / {num(p['concurrency'][t]['p99_ms'])}"
                                        for t in threads)] for p in points if p["concurrency"]]
    sets = join_words([f"{bold(name)}: {count(s['vectors'])} vectors, {count(s['queries'])} queries"
                       for name, s in data["datasets"].items()])
    return f"""\
Vector sets of all-MiniLM-L6-v2 {data['model_precision']} embeddings (384-d, normalised, inner product): {sets}. The
SciFact vectors are the index's chunks queried with the train claims; the wiki vectors are the Wikipedia
summaries cut into 20-token windows, with random chunks held out as queries.

Recall@10 is measured against exact search on the same vectors. Throughput and latency come from threads each
searching one query at a time, with FAISS's OpenMP pinned to one thread per search, for {data['seconds']:g} s per
point. Builds use every core. "MB" is the serialised index.

Search-parameter sweeps at one searcher (recall@10 / QPS / P99 ms):

{table(["index", *datasets], rows, "l" + "r" * len(datasets))}

Concurrency at the default search settings (QPS / P99 ms by concurrent searchers):

{table(["data", "index", "build s", "MB", *threads], sweep, "llrr" + "r" * len(threads))}

What the figures show:

{chr(10).join(_ann_findings(points, datasets, data["threads"]))}

{ANN_REFERENCE}"""


def _ann_findings(points, datasets, threads) -> list[str]:
    lines = []
    for dataset in datasets:
        hnsw = [p for p in points if p["dataset"] == dataset and p["index"].startswith("hnsw") and p["concurrency"]]
        ivf = [p for p in points if p["dataset"] == dataset and p["index"].startswith("ivfpq")]
        flat = _point(points, dataset, "flat", "exact")
        m16, m64 = (next((p for p in hnsw if p["index"] == f"hnsw M={m}"), None) for m in (16, 64))
        if m16 and m64 and len(threads) > 1:
            first, last = str(threads[0]), str(threads[-1])
            by = m16["concurrency"]
            peak = max(threads, key=lambda t: by[str(t)]["qps"])
            lines.append(f"- **{dataset}, HNSW M=16 efSearch 128**: {count(by[first]['qps'])} QPS at {first} "
                         f"searcher(s), most ({count(by[str(peak)]['qps'])}) at {peak}; P99 goes from "
                         f"{num(by[first]['p99_ms'])} ms at {first} to {num(by[last]['p99_ms'])} ms at {last}.")
            low16, low64 = (_point(points, dataset, f"hnsw M={m}", "efSearch=16") for m in (16, 64))
            if low16 and low64:
                lines.append(f"- **{dataset}, M=16 against M=64**: at efSearch 16 recall@10 "
                             f"{compare(low64['recall_at_10'], low16['recall_at_10'], 'rises', 'falls', 'stays')} from "
                             f"{low16['recall_at_10']:.3f} to {low64['recall_at_10']:.3f} with M=64; at efSearch 128 "
                             f"one searcher gets {count(m64['qps_1'])} QPS with M=64 against {count(m16['qps_1'])} "
                             f"with M=16 ({pct(100 * (m64['qps_1'] / m16['qps_1'] - 1), 0)}).")
        if ivf and flat:
            recalls = [p["recall_at_10"] for p in ivf]
            by_probe = {p["search"]: p["recall_at_10"] for p in ivf}
            gain = (f"; nprobe 16 → 64 changes it by {num(by_probe['nprobe=64'] - by_probe['nprobe=16'], 3)}"
                    if {"nprobe=16", "nprobe=64"} <= set(by_probe) else "")
            lines.append(f"- **{dataset}, IVF-PQ ({ivf[0]['index'].split(' ', 1)[1]})**: recall@10 "
                         f"{min(recalls):.3f}–{max(recalls):.3f}{gain}; the index is {num(ivf[0]['memory_mb'], 1)} MB "
                         f"against flat's {num(flat['memory_mb'], 1)} MB.")
        good = [p for p in points if p["dataset"] == dataset and p["index"].startswith("hnsw")
                and p["recall_at_10"] >= 0.98]
        if good:
            fastest = min(good, key=lambda p: p["p99_ms_1"])
            lines.append(f"- **{dataset}**: the lowest single-searcher P99 at recall@10 ≥ 0.98 is "
                         f"{num(fastest['p99_ms_1'])} ms ({fastest['index']} {fastest['search']}).")
    return lines


def _budget(losses: list[float]) -> str:
    low, high = spread(losses)
    mid = median(losses)
    text = f"The budget for the default probes is {pct(SCHEDULER_BUDGET_PCT, 0)}: "
    if high <= SCHEDULER_BUDGET_PCT:
        return text + f"every round stayed within it (highest {pct(high)})."
    if mid <= SCHEDULER_BUDGET_PCT:
        return text + (f"the median round ({pct(mid)}) is within it, but single rounds reached {pct(high)}, so this "
                       f"run cannot promise it.")
    return text + f"the median round ({pct(mid)}) is over it."


def probes(d: dict) -> str:
    data = d["probes"]
    service, sched, sysc, settings = data["service"], data["scheduler"], data["syscall"], data["settings"]
    labels = {"off": "off", "scheduler": "scheduler (default: run-queue, off-CPU, TCP retransmits)",
              "scheduler+syscalls": "scheduler + syscalls"}
    rows = [[labels.get(name, name), with_range(row["rps_rounds"], lambda v: num(v, 1)),
             "—" if name == "off" else with_range(row["rounds_throughput_loss_pct"], pct), num(row["p50_ms"]),
             with_range(row["rounds_p99_ms"]), count(row["requests"])] for name, row in service.items()]
    ns = lambda values: with_range(values, count)  # noqa: E731
    cost, other = count(sysc["probe_cost_ns_target"]), count(sysc["probe_cost_ns_other_process"])
    micro = [["pipe round trip, target and child pinned to one CPU (2 wake-ups, 4 context switches)",
              ns(sched["runs"]["off"]), ns(sched["runs"]["on"]),
              f"{count(sched['probe_cost_ns_round_trip'])} ns per round trip"],
             ["`getppid()` in the target", ns(sysc["runs"]["off"]), ns(sysc["runs"]["on_target"]),
              bold(f"{cost} ns per system call")],
             ["`getppid()` in another process while the target is probed", ns(sysc["runs"]["off"]),
              ns(sysc["runs"]["on_other_process"]), f"{other} ns per system call, paid by every process on the host"]]
    rates = service["scheduler+syscalls"].get("rounds_service_syscalls_per_s") or []
    load = (f"Under this load the service made {count(median(rates))} system calls per second (median over rounds, from "
            f"the exporter's own counts), which at {cost} ns each is "
            f"{pct(median(rates) * sysc['probe_cost_ns_target'] / 1e9 * 100, 2)} of a core, plus the cost to the rest "
            f"of the host." if rates else "The service's system-call rate was not recorded in this run.")
    ratio = num(sysc["ns_per_call_median"]["on_target"] / sysc["ns_per_call_median"]["off"], 1)
    return f"""\
One `ragheat serve` on the SciFact index; {settings['rounds']} rounds of {settings['round_s']} s with \
{settings['clients']} closed-loop clients. Each round runs `off`, `scheduler` and `scheduler+syscalls` back to back;
each "on" configuration is a real `ragheat probes --pid` exporter, scraped once per round. A round's loss is its
throughput against the `off` run of the same round, so load from other processes mostly cancels; the table gives the
median and the range of those per-round losses.

{table(["probes", "req/s (median, min–max)", "throughput loss per round (median, min–max)", "P50 ms",
        "P99 ms per round (median, min–max)", "requests"], rows, "lrrrrr")}

- {noise_verdict(service['scheduler']['rounds_throughput_loss_pct'], 'Throughput loss with the scheduler probes')}
- {_budget(service['scheduler']['rounds_throughput_loss_pct'])}
- {noise_verdict(service['scheduler+syscalls']['rounds_throughput_loss_pct'], 'Throughput loss with the syscall '
                'probe too')}

Micro-benchmarks in the same run ({settings['syscall_runs']} alternating runs each):

{table(["what", "off ns (median, min–max)", "on ns (median, min–max)", "probe cost (medians)"], micro, "lrrr")}

- **The scheduler probes cost about {num(sched['probe_cost_ns_round_trip'] / 4 / 1000, 2)} µs per context switch or
  wake-up** (a round trip is two wake-ups and four switches).
- **The syscall probe costs {cost} ns per call of the service ({ratio}× a bare `getppid()`), plus {other} ns per call
  of every other process**: any enabled syscall tracepoint puts every task on the kernel's slow syscall path, plus
  the in-kernel pid filter. {load} It stays **off by default** (`probes.syscalls=false`, `--syscalls` to turn it on
  while investigating)."""
