"""Sections on capacity: the load generator, the SciFact service's knee, ANN indexes, probe overhead, vLLM tuning."""

from __future__ import annotations

from typing import Mapping

from .stats import bold, compare, count, join_words, median, noise_verdict, num, pct, spread, table, with_range

SEND_ERROR_TARGET_MS = 1.0  # the generator must fire within 1 ms of schedule at P99 (issue 6)
OFFERED_TARGET = 2000.0
SCHEDULER_BUDGET_PCT = 2.0  # issue 8's budget for the default probes


def _opt(value, digits: int = 2) -> str:
    return "–" if value is None else num(value, digits)


def loadgen(results: Mapping[str, dict]) -> dict:
    data = results["loadgen"]
    steps = data["steps"]
    keeping = [s for s in steps if s["send_error_ms"].get("p99") is not None
               and s["send_error_ms"]["p99"] < SEND_ERROR_TARGET_MS and s["achieved"] >= 0.98 * s["offered"]
               and s["errors"] == 0]
    top = max(keeping, key=lambda s: s["offered"]) if keeping else None
    rows = []
    for s in steps:
        e, l = s["send_error_ms"], s["latency_ms"]
        strong = top is not None and s is top
        offered = count(s["offered"])
        rows.append([bold(offered) if strong else offered, num(s["achieved"], 1), count(s["errors"]),
                     f"{_opt(e.get('p50'), 3)} / {bold(_opt(e.get('p99'), 3)) if strong else _opt(e.get('p99'), 3)}"
                     f" / {_opt(e.get('p99.9'), 3)}", f"{_opt(l.get('p50'))} / {_opt(l.get('p99'))}"])
    if top is None:
        verdict = (f"Target: at least {count(OFFERED_TARGET)} req/s offered with send-time error P99 under "
                   f"{SEND_ERROR_TARGET_MS:g} ms — {bold('not met')}: no rate kept the send-time error P99 under "
                   f"{SEND_ERROR_TARGET_MS:g} ms.")
    else:
        ok = top["offered"] >= OFFERED_TARGET
        verdict = (f"Target: at least {count(OFFERED_TARGET)} req/s offered with send-time error P99 under "
                   f"{SEND_ERROR_TARGET_MS:g} ms — {'met' if ok else bold('not met')}: the highest rate that kept it "
                   f"is {count(top['offered'])} req/s ({num(top['send_error_ms']['p99'], 3)} ms).")
    return {"duration": f"{data['duration_s']:g}", "warmup": f"{data['warmup_s']:g}",
            "table": table(["offered req/s", "achieved", "errors", "send-time error P50 / P99 / P99.9 ms",
                            "latency P50 / P99 ms"], rows, "rrrrr"),
            "verdict": verdict}


def knee(results: Mapping[str, dict]) -> dict:
    data = results["knee-scifact"]
    slo = data["slo_ms"]
    knee_qps = data["knee_qps"]
    rows = []
    for s in data["steps"]:
        lat = s["latency_ms"]
        # As find_knee: a step meets the SLO with its P99 within it and errors and shed queries each within the
        # allowance (a shed query got no answer).
        shed_rate = s.get("shed_rate", 0.0)
        meets = (lat["p99"] is not None and lat["p99"] <= slo and s["error_rate"] <= data["max_error_rate"]
                 and shed_rate <= data["max_error_rate"])
        is_knee = knee_qps is not None and s["offered_qps"] == knee_qps
        offered = count(s["offered_qps"]) + (" (cut)" if s["interrupted"] else "")
        stages = s.get("stages_ms") or {}
        embed, rerank = stages.get("embed") or {}, stages.get("rerank") or {}
        cpu = s.get("cpu_ms_per_answer") or {}
        rows.append([bold(offered) if is_knee else offered, num(s["achieved_qps"], 1),
                     *(_opt(lat[k]) for k in ("p50", "p90", "p99", "p99.9")),
                     f"{count(s.get('shed', 0))} ({shed_rate * 100:.1f} %)", _opt(embed.get("p50")),
                     _opt(rerank.get("p50")),
                     f"{num(cpu['service'], 1)} + {num(cpu['generator'], 1)}" if cpu else "–",
                     _opt(cpu.get("ceiling_qps"), 0) if cpu else "–",
                     _opt(s["send_error_ms"].get("p99")),
                     bold("yes (knee)") if is_knee else ("yes" if meets else "no")])
    sends = [s["send_error_ms"]["p99"] for s in data["steps"] if s["send_error_ms"].get("p99") is not None]
    service = data.get("service") or {}
    return {"table": table(["offered req/s", "answered", "P50 ms", "P90 ms", "P99 ms", "P99.9 ms", "shed",
                            "embed P50 ms", "rerank P50 ms", "CPU ms/answer service + generator", "CPU ceiling req/s",
                            "send err P99 ms", f"meets the SLO (P99 ≤ {slo:g} ms, ≤ "
                            f"{data['max_error_rate'] * 100:g} % errors and shed)"], rows, "rrrrrrrrrrrrl"),
            "knee": bold(f"{count(knee_qps)} req/s") if knee_qps is not None else bold("none of the offered rates"),
            "slo": f"{slo:g}",
            "duration": f"{data['duration_s']:g}", "warmup": f"{data['warmup_s']:g}",
            "send_range": f"{num(min(sends))}–{num(max(sends))} ms" if sends else "not recorded",
            "served": (f"{count(service['chunks'])} chunks of {service.get('corpus', '?')}" if service.get("chunks")
                       else "the SciFact index")}


def _point(points, dataset: str, index: str, search: str):
    return next((p for p in points if p["dataset"] == dataset and p["index"] == index and p["search"] == search), None)


def _cell(p) -> str:
    return "–" if p is None else f"{p['recall_at_10']:.3f} / {count(p['qps_1'])} / {num(p['p99_ms_1'])}"


def ann(results: Mapping[str, dict]) -> dict:
    data = results["ann"]
    points = data["points"]
    datasets = list(data["datasets"])
    show = {"hnsw": ("efSearch=16", "efSearch=64", "efSearch=256"), "ivfpq": ("nprobe=1", "nprobe=16", "nprobe=64")}
    families: dict[str, dict[str, str]] = {}  # "flat", "hnsw M=16", ..., "ivfpq" -> data set -> index name
    for p in points:
        family = "ivfpq" if p["index"].startswith("ivfpq") else p["index"]
        families.setdefault(family, {})[p["dataset"]] = p["index"]
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
            if kind == "ivfpq" and name:
                text += f" ({name.split(' ', 1)[1]})"
            cells.append(text)
        rows.append([label, *cells])
    sweep_rows = []
    threads = [str(t) for t in data["threads"]]
    for p in points:
        if not p["concurrency"]:
            continue
        sweep_rows.append([p["dataset"], f"{p['index']} {p['search']}".replace(" exact", ""), num(p["build_s"], 1),
                           num(p["memory_mb"], 1),
                           *(f"{count(p['concurrency'][t]['qps'])} / {num(p['concurrency'][t]['p99_ms'])}"
                             for t in threads)])
    out = {"sweep_table": table(["index", *datasets], rows, "l" + "r" * len(datasets)),
           "concurrency_table": table(["data", "index", "build s", "MB", *threads], sweep_rows, "llrr" + "r" * len(threads)),
           "sets": join_words([f"{bold(name)}: {count(d['vectors'])} vectors, {count(d['queries'])} queries"
                               for name, d in data["datasets"].items()]),
           "seconds": f"{data['seconds']:g}", "precision": data["model_precision"]}
    out["findings"] = "\n".join(_ann_findings(points, datasets, data["threads"]))
    return out


def _ann_findings(points, datasets, threads) -> list[str]:
    lines = []
    for dataset in datasets:
        hnsw = [p for p in points if p["dataset"] == dataset and p["index"].startswith("hnsw") and p["concurrency"]]
        ivf = [p for p in points if p["dataset"] == dataset and p["index"].startswith("ivfpq")]
        flat = _point(points, dataset, "flat", "exact")
        m16, m64 = (next((p for p in hnsw if p["index"] == f"hnsw M={m}"), None) for m in (16, 64))
        if m16 and m64 and len(threads) > 1:
            first, last = str(threads[0]), str(threads[-1])
            peak = max(threads, key=lambda t: m16["concurrency"][str(t)]["qps"])
            lines.append(f"- **{dataset}, HNSW M=16 efSearch 128**: {count(m16['concurrency'][first]['qps'])} QPS at "
                         f"{first} searcher(s), most ({count(m16['concurrency'][str(peak)]['qps'])}) at {peak}; P99 goes "
                         f"from {num(m16['concurrency'][first]['p99_ms'])} ms at {first} to "
                         f"{num(m16['concurrency'][last]['p99_ms'])} ms at {last}.")
            low16 = _point(points, dataset, "hnsw M=16", "efSearch=16")
            low64 = _point(points, dataset, "hnsw M=64", "efSearch=16")
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


def probes(results: Mapping[str, dict]) -> dict:
    data = results["probes"]
    service, sched, sysc = data["service"], data["scheduler"], data["syscall"]
    settings = data["settings"]
    labels = {"off": "off", "scheduler": "scheduler (default: run-queue, off-CPU, TCP retransmits)",
              "scheduler+syscalls": "scheduler + syscalls"}
    rows = []
    for name, row in service.items():
        losses = row["rounds_throughput_loss_pct"]
        rows.append([labels.get(name, name), with_range(row["rps_rounds"], lambda v: num(v, 1)),
                     "—" if name == "off" else with_range(losses, pct), num(row["p50_ms"]),
                     with_range(row["rounds_p99_ms"]), count(row["requests"])])
    micro = [
        ["pipe round trip, target and child pinned to one CPU (2 wake-ups, 4 context switches)",
         with_range(sched["runs"]["off"], lambda v: count(v)), with_range(sched["runs"]["on"], lambda v: count(v)),
         f"{count(sched['probe_cost_ns_round_trip'])} ns per round trip"],
        ["`getppid()` in the target", with_range(sysc["runs"]["off"], lambda v: count(v)),
         with_range(sysc["runs"]["on_target"], lambda v: count(v)),
         bold(f"{count(sysc['probe_cost_ns_target'])} ns per system call")],
        ["`getppid()` in another process while the target is probed", with_range(sysc["runs"]["off"], lambda v: count(v)),
         with_range(sysc["runs"]["on_other_process"], lambda v: count(v)),
         f"{count(sysc['probe_cost_ns_other_process'])} ns per system call, paid by every process on the host"],
    ]
    sched_losses = service["scheduler"]["rounds_throughput_loss_pct"]
    rates = service["scheduler+syscalls"].get("rounds_service_syscalls_per_s") or []
    out = {
        "rounds": settings["rounds"], "round_s": settings["round_s"], "clients": settings["clients"],
        "runs": settings["syscall_runs"],
        "table": table(["probes", "req/s (median, min–max)", "throughput loss per round (median, min–max)", "P50 ms",
                        "P99 ms per round (median, min–max)", "requests"], rows, "lrrrrr"),
        "micro_table": table(["what", "off ns (median, min–max)", "on ns (median, min–max)", "probe cost (medians)"],
                             micro, "lrrr"),
        "scheduler_verdict": noise_verdict(sched_losses, "Throughput loss with the scheduler probes"),
        "syscalls_verdict": noise_verdict(service["scheduler+syscalls"]["rounds_throughput_loss_pct"],
                                          "Throughput loss with the syscall probe too"),
        "budget": (f"The budget for the default probes is {pct(SCHEDULER_BUDGET_PCT, 0)}: "
                   + _budget_sentence(sched_losses)),
        "per_switch": num(sched["probe_cost_ns_round_trip"] / 4 / 1000, 2),
        "syscall_ratio": num(sysc["ns_per_call_median"]["on_target"] / sysc["ns_per_call_median"]["off"], 1),
        "syscall_cost": count(sysc["probe_cost_ns_target"]),
        "syscall_other": count(sysc["probe_cost_ns_other_process"]),
    }
    if rates:
        per_s = median(rates)
        out["syscall_load"] = (f"Under this load the service made {count(per_s)} system calls per second (median over "
                               f"rounds, from the exporter's own counts), which at "
                               f"{count(sysc['probe_cost_ns_target'])} ns each is "
                               f"{pct(per_s * sysc['probe_cost_ns_target'] / 1e9 * 100, 2)} of a core, plus the cost "
                               f"to the rest of the host.")
    else:
        out["syscall_load"] = "The service's system-call rate was not recorded in this run."
    return out


def _budget_sentence(losses: list[float]) -> str:
    low, high = spread(losses)
    mid = median(losses)
    if high <= SCHEDULER_BUDGET_PCT:
        return f"every round stayed within it (highest {pct(high)})."
    if mid <= SCHEDULER_BUDGET_PCT:
        return (f"the median round ({pct(mid)}) is within it, but single rounds reached {pct(high)}, so this run "
                f"cannot promise it.")
    return f"the median round ({pct(mid)}) is over it."


def tune_vllm(results: Mapping[str, dict]) -> dict:
    data = results["tune-vllm"]
    cells = data["cells"]
    slo = data["slo"]
    rows = []
    for c in sorted(cells, key=lambda c: (c["block_size"] or 0, c["max_model_len"], c["max_num_seqs"])):
        if c["failure"]:
            rows.append([count(c["max_model_len"]), count(c["max_num_seqs"]), "–", "–", "–", "–", "failed to start"])
            continue
        rows.append([count(c["max_model_len"]), count(c["max_num_seqs"]), num(c["tokens_per_s"], 1),
                     _opt(c["ttft_p99_ms"], 1), _opt(c["e2e_p99_ms"], 1), f"{c['errors']}/{c['requests']}",
                     bold("meets") if c["meets_slo"] else "misses"])
    requests = max((c["requests"] for c in cells), default=0)
    offered_tok = requests * data["max_tokens"] / data["duration_s"]
    model = data.get("model_config") or {}
    return {
        "table": table(["max_model_len", "max_num_seqs", "output tok/s", "TTFT P99 ms", "E2E P99 ms", "errors",
                        f"SLO (TTFT ≤ {slo['ttft_p99_ms']:g}, E2E ≤ {count(slo['e2e_p99_ms'])} ms)"], rows, "rrrrrrl"),
        "requests": count(requests), "rate": f"{data['rate']:g}", "duration": f"{data['duration_s']:g}",
        "prompt_tokens": count(data["prompt_tokens"]), "max_tokens": count(data["max_tokens"]),
        "offered_tok": count(offered_tok),
        "model": (f"{model.get('model_type', '?')}, {model.get('num_hidden_layers', '?')} layers, hidden "
                  f"{model.get('hidden_size', '?')}"),
        "axes": _axes_sentence(cells),
    }


def tune_vllm_real(results: Mapping[str, dict]) -> dict:
    """The same sweep on the real model (``tune-vllm-real``)."""
    return tune_vllm({"tune-vllm": results["tune-vllm-real"]})


def _axes_sentence(cells: list[dict]) -> str:
    """Which setting decides whether a cell meets the SLO: one that changes the outcome with the other held fixed."""
    ok = {(c["max_num_seqs"], c["max_model_len"], c["block_size"]): c["meets_slo"] for c in cells}
    seqs = sorted({k[0] for k in ok})
    lens = sorted({k[1] for k in ok})

    def varies(axis: int) -> bool:
        groups: dict = {}
        for key, meets in ok.items():
            groups.setdefault(tuple(v for i, v in enumerate(key) if i != axis), set()).add(meets)
        return any(len(v) > 1 for v in groups.values())

    decide = [name for name, axis, values in (("`max_num_seqs`", 0, seqs), ("`max_model_len`", 1, lens))
              if len(values) > 1 and varies(axis)]
    still = [name for name, axis, values in (("`max_num_seqs`", 0, seqs), ("`max_model_len`", 1, lens))
             if len(values) > 1 and not varies(axis)]
    if not decide:
        verdict = "all" if all(ok.values()) else "none" if not any(ok.values()) else "some"
        return f"No single setting decides the outcome here: {verdict} of the cells meet the SLO."
    return (f"{join_words(decide)} decides whether a cell meets the SLO here"
            + (f"; {join_words(still)} does not change the outcome at any value of the other" if still else "") + ".")
