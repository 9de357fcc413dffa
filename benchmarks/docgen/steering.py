"""The section on steering under load: the quality-ladder controller against admission control alone and against
neither, at steady multiples of the full-quality knee, through a burst and up a ramp, and whether the controller met
its targets (the thresholds below; every figure they are checked against comes from the results file)."""

from __future__ import annotations

from .stats import blocks, bold, count, join_words, num, opt, table

GOODPUT_AT_DOUBLE = (2.0, 1.5)  # at this multiple of the knee, goodput at least this multiple of the knee
GOODPUT_AT_QUADRUPLE = (4.0, 1.0)
CALM_FACTOR = 1.0  # at the knee itself: no level change, every answer at full quality
RECOVERY_S = 30.0  # full quality back within this after the load falls
CHANGES_PER_MINUTE = 2.0  # at most this many level changes a minute at steady load
CONFIG_WORDS = {"steer": "the controller on, admission control's defaults", "shed": "admission control alone (the "
                "defaults): every answer at full quality", "neither": "admission control off: every query queued"}


def _pct(share: float) -> str:
    return f"{share * 100:.0f} %"


def _mix(levels: dict, order: list[str]) -> str:
    """Answers by quality level, best first: ``full 40 % · bm25_only 60 %``."""
    total = sum(levels.values())
    if not total:
        return "–"
    ranked = sorted(levels, key=lambda k: order.index(k) if k in order else len(order))
    return " · ".join(f"{k} {_pct(levels[k] / total)}" for k in ranked)


def _changes(c: dict | None) -> int | None:
    return None if c is None else c["down"] + c["up"]


def _changes_cell(c: dict | None) -> str:
    return "–" if c is None else f"{_changes(c)} ({c['down']} down, {c['up']} up)"


def _seconds(value: float | None, none: str = "never") -> str:
    return none if value is None else f"{num(value, 1)} s"


def _level(index: int | None, names: list[str]) -> str:
    return "–" if index is None else f"`{names[index]}`"


def _track(gauge: list, names: list[str], shift: float = 0.0) -> str:
    """The gauge's changes as ``t s: level`` (seconds from ``shift``)."""
    return " → ".join(f"{num(t - shift, 1)} s `{names[int(i)]}`" for t, i in gauge) or "no sample"


def _first_down(gauge: list) -> tuple[int | None, float | None]:
    """From a gauge track ([seconds from the rise, level]): the level at the rise and the seconds until it first went
    below that level (None: never)."""
    start = next((int(i) for t, i in reversed(gauge) if t <= 0), None)
    return start, next((t for t, i in gauge if t > 0 and start is not None and i > start), None)


def _step(steps: list[dict], config: str, factor: float) -> dict | None:
    return next((s for s in steps if s["config"] == config and s["factor"] == factor), None)


def _cpu(s: dict) -> str:
    cpu = s.get("cpu_ms_per_answer") or {}
    return f"{num(cpu['service'], 1)} + {num(cpu['generator'], 1)}" if cpu.get("service") is not None else "–"


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else bold("not met")


def targets(d: dict) -> list[tuple[str, bool | None, str]]:
    """Each target: what it asks, whether the run met it (None: not measured) and the figures it was judged on."""
    knee, slo, steps = d["knee"]["qps"], d["slo_ms"], d["steady"]["steps"]
    out = []
    for (factor, least), extra in ((GOODPUT_AT_DOUBLE, True), (GOODPUT_AT_QUADRUPLE, False)):
        s = _step(steps, "steer", factor)
        p99 = None if s is None else s["latency_ms"].get("p99")
        ask = (f"at {factor:g}× the knee, goodput ≥ {least:g}× the knee ({num(least * knee, 0)} req/s)"
               + (f" with admitted P99 ≤ {slo:g} ms" if extra else ""))
        if s is None:
            out.append((ask, None, "not offered"))
            continue
        met = s["goodput_qps"] >= least * knee and (not extra or (p99 is not None and p99 <= slo))
        out.append((ask, met, f"goodput {num(s['goodput_qps'], 1)} req/s ({num(s['goodput_qps'] / knee, 2)}× the "
                              f"knee), admitted P99 {opt(p99, 1)} ms"))
    s = _step(steps, "steer", CALM_FACTOR)
    ask = f"at {CALM_FACTOR:g}× the knee, no level change (warm-up included) and every answer at full quality"
    if s is None:
        out.append((ask, None, "not offered"))
    else:
        changes, answered = _changes(s["changes_step"]), sum(s["levels"].values())
        full = s["levels"].get("full", 0) / answered if answered else None
        met = None if changes is None or full is None else changes == 0 and full == 1.0
        out.append((ask, met, f"{'–' if changes is None else changes} level changes, "
                              f"{'–' if full is None else _pct(full)} of the answers at full quality"))
    burst = d["burst"]["configs"].get("steer")
    ask = f"full quality back within {RECOVERY_S:g} s after the load falls (the burst's end)"
    if burst is None:
        out.append((ask, None, "no burst measured"))
    else:
        back = burst["controller"].get("back_to_full_s")
        out.append((ask, back is not None and back <= RECOVERY_S,
                    f"back at full {_seconds(back, 'not within the run')} after the burst ended"))
    measured = [s for s in steps if s["config"] == "steer" and s["changes_measured"] is not None]
    ask = f"at most {CHANGES_PER_MINUTE:g} level changes a minute at steady load"
    if not measured:
        out.append((ask, None, "no steady step measured"))
    else:
        minutes = sum(s["duration_s"] for s in measured) / 60
        total = sum(_changes(s["changes_measured"]) for s in measured)
        worst = max(measured, key=lambda s: _changes(s["changes_measured"]))
        out.append((ask, total / minutes <= CHANGES_PER_MINUTE,
                    f"{total} changes in the {count(minutes * 60)} s measured over the steady steps "
                    f"({num(total / minutes, 1)} a minute); the most in one step: "
                    f"{_changes(worst['changes_measured'])} at {worst['factor']:g}×"))
    return out


def _knee(d: dict) -> str:
    k = d["knee"]
    if not k["measured"]:
        return f"The full-quality knee was given ({count(k['qps'])} req/s, `--knee`), not measured in this run."
    cells = "; ".join(f"{s['offered_qps']:g}: {opt(s['latency_ms'].get('p99'), 1)} ms"
                      + (f" (shed {_pct(s['shed_rate'])})" if s["shed"] else "") for s in k["steps"])
    tried = k.get("confirmations") or []
    swept = tried[0]["offered_qps"] if tried else k["qps"]  # confirmation starts at the sweep's knee
    figure = f"{count(swept)} req/s" if tried else bold(count(k["qps"]) + " req/s")
    return (f"The full-quality knee, measured on `shed` ({k['duration_s']:g} s per rate after {k['warmup_s']:g} s of "
            f"warm-up, ascending until the first rate that misses the SLO; the highest offered rate with P99 ≤ "
            f"{d['slo_ms']:g} ms, errors and shed queries ≤ {d['max_error_rate'] * 100:g} %, every lower rate "
            f"meeting it too): {figure} (P99 per offered rate: {cells})"
            + (": the highest rate offered met the SLO, so the knee may lie above it." if k.get("top_met") else ".")
            + _confirmed(d))


def _confirmed(d: dict) -> str:
    """The sweep's passing rates tried over a steady step's length, from the highest down, until one held."""
    tried = d["knee"].get("confirmations") or []
    if not tried:
        return ""
    st = d["steady"]
    cells = "; ".join(f"{s['offered_qps']:g}: P99 {opt(s['latency_ms'].get('p99'), 1)} ms, "
                      f"{num(s['shed_rate'] * 100, 1)} % refused, {'held' if s['held'] else 'missed'}" for s in tried)
    held = tried[-1]["held"]
    on = tried[0].get("config", "shed")  # older results confirmed on shed
    why = (" (admission control off: at a rate past the capacity admission control refuses the excess as it comes and"
           " a short step can stay under the refusals the knee allows; with every query queued the queue shows)"
           if on == "neither" else "")
    return (f" Confirmed on `{on}`{why} over a steady step's length ({st['warmup_s']:g} s of warm-up and "
            f"{tried[0]['duration_s']:g} s measured) on the arrivals the {CALM_FACTOR:g}× step offers, the passing "
            f"rates from the highest down until one held: {cells}"
            + (f": {bold(count(d['knee']['qps']) + ' req/s')}, the knee the steps below multiply." if held else
               ": none held, so the steps below multiply the sweep's knee."))


def _steady(d: dict) -> str:
    st, knee, names = d["steady"], d["knee"]["qps"], d["level_names"]
    rows = []
    for s in st["steps"]:
        p99 = s["latency_ms"].get("p99")
        rows.append([s["factor"], f"{s['offered_qps']:g}", s["config"],
                     f"{num(s['goodput_qps'], 1)} ({num(s['goodput_qps'] / knee, 2)}×)", opt(p99, 1),
                     _refused(s), count(s["errors"]), _mix(s["levels"], names), opt(s["mean_ndcg"], 4),
                     f"{_changes_cell(s['changes_measured'])}; whole step {opt(_changes(s['changes_step']), 0)}",
                     _cpu(s)])
    rows += [[factor, f"{factor * knee:g}", config, "not offered (`--skip`)", *["–"] * 7]
             for config, factor in st["skipped"]]
    rows = [[f"{r[0]:g}×", *r[1:]] for r in sorted(rows, key=lambda r: r[0])]
    return table(["load", "offered req/s", "configuration", "goodput req/s (× knee)", "admitted P99 ms", "refused /s",
                  "errors", "answers by quality level", "mean nDCG@10 (ladder)", "level changes measured", "CPU ms per "
                  "answer: service + generator"], rows, "rrlrrrrlrlr",
                 f"Steady load: {_durations(st)} after {st['warmup_s']:g} s of warm-up, per multiple of the knee "
                 f"and configuration, the configurations in turn (the order rotating from one multiple to "
                 f"the next). Goodput = answers within {d['slo_ms']:g} ms per second; admitted P99 = of the answered "
                 f"queries; refused = queries admission control shed (in brackets by the service's reason, "
                 f"`ragheat_requests_shed_total`, warm-up included); level changes = the service's own counter "
                 f"(ragheat_quality_level_changes_total) over the measured part, and over the whole step, warm-up "
                 f"included.")


def _refused(step: dict) -> str:
    reasons = step.get("shed_by_reason") or {}
    text = num(step["shed_qps"], 1)
    return text + (f" ({', '.join(f'{reason} {n}' for reason, n in reasons.items())})" if reasons else "")


def _durations(st: dict) -> str:
    longer = [f for f in st["factors"] if f in st.get("long_factors", ())]
    text = f"{st['duration_s']:g} s measured"
    if longer:
        text += f" ({st['long_duration_s']:g} s at {join_words([f'{f:g}×' for f in longer])})"
    return text


def _starts(d: dict) -> str:
    """The rung ``steer`` was at when each steady step began: how far it had climbed back while the others ran."""
    names, steps = d["level_names"], [s for s in d["steady"]["steps"] if s["config"] == "steer"]
    cells = [f"{s['factor']:g}× at {_level(s['level_at_start'], names)}" for s in steps]
    if not cells:
        return ""
    text = ("The rung `steer` served when each of its steady steps began (it idles while the others are measured, "
            "and climbs back meanwhile): " + join_words(cells) + ".")
    shed = _step(d["steady"]["steps"], "shed", CALM_FACTOR)
    shed_p99 = None if shed is None else shed["latency_ms"].get("p99")
    if shed is not None and (shed["shed_rate"] > d["max_error_rate"] or (shed_p99 or 0) > d["slo_ms"]):
        text += (f" At {CALM_FACTOR:g}× `shed` itself missed the knee's criteria over the longer steady step (P99 "
                 f"{opt(shed_p99, 1)} ms, {num(shed['shed_rate'] * 100, 1)} % refused): the "
                 f"knee measured in {d['knee']['duration_s']:g}-s steps is at the edge of what the service holds.")
    return text


def _burst(d: dict) -> str:
    b, names, knee = d["burst"], d["level_names"], d["knee"]["qps"]
    if not b["configs"]:
        return ""
    rows = []
    for config, r in b["configs"].items():
        for part in ("base", "burst", "after"):
            w = r["windows"][part]
            rows.append([config if part == "base" else "", f"{part} ({w['offered_qps']:g} req/s)",
                         f"{num(w['goodput_qps'], 1)} ({num(w['goodput_qps'] / knee, 2)}×)",
                         opt(w["latency_ms"].get("p99"), 1), num(w["shed_qps"], 1), count(w["errors"]),
                         _mix(w["levels"], names)])
    text = [table(["configuration", "part (offered)", "goodput req/s (× knee)", "admitted P99 ms", "refused /s",
                   "errors", "answers by quality level"], rows, "llrrrrl",
                  f"The burst: {b['base_s']:g} s at {b['base_factor']:g}× the knee, {b['burst_s']:g} s at "
                  f"{b['burst_factor']:g}×, then {b['after_s']:g} s at {b['base_factor']:g}× again for `steer` "
                  f"({b['others_after_s']:g} s for the others), measured from its first request (no warm-up), each "
                  f"part by the intended send time of its requests.")]
    steer = b["configs"].get("steer")
    if steer is not None:
        c, settled = steer["controller"], steer.get("settled") or {}
        at_rise, down = _first_down([[t - b["base_s"], i] for t, i in steer["gauge"]])
        text.append(
            f"The controller in the burst (`ragheat_quality_level` scraped every {d['sample_s']:g} s, and the "
            f"answers' own `quality_level` by send time): at the burst's start it served "
            f"{_level(at_rise, names)} (after waiting {_seconds(settled.get('waited_s'))} for it to be back at full "
            f"quality before the run); first step down {_seconds(down)} after the burst began; lowest rung "
            f"{_level(c['lowest_level'], names)}; back at full "
            f"{_seconds(c.get('back_to_full_s'), 'not within the run')} after the burst ended"
            + (", then down again before the run ended" if c.get("down_again_after_full") else "")
            + f" (the last answer below full was sent {_seconds(c.get('last_answer_below_full_s'), 'before it')} "
              f"after the end); {_changes_cell(steer['changes'])} level changes in all. The level over time, from "
              f"the burst's start: {_track(steer['gauge'], names, b['base_s'])}.")
    return blocks(*text)


def _ramp(d: dict) -> str:
    r, names, knee = d["ramp"], d["level_names"], d["knee"]["qps"]
    run = r["run"]
    if run is None:
        return ""
    c, w, settled = run["controller"], run["whole"], run.get("settled") or {}
    at_rise, down = _first_down(run["gauge"])
    first = None if down is None else r["from_factor"] + (r["to_factor"] - r["from_factor"]) * down / r["seconds"]
    start = ("at full quality" if at_rise == 0 else
             f"at {_level(at_rise, names)}, not full quality: the controller had not stepped back up in the "
             f"{_seconds(settled.get('waited_s'))} it was given")
    return (f"The ramp, on `steer` alone: offered {r['from_factor']:g}× to {r['to_factor']:g}× the knee over "
            f"{r['seconds']:g} s, starting {start}. First step down"
            + (f" below it after {_seconds(down)}" if at_rise else f" after {_seconds(down)}")
            + ("" if first is None else f", when {num(first, 2)}× the knee ({num(first * knee, 0)} req/s) was offered")
            + f"; lowest rung {_level(c['lowest_level'], names)}; {_changes_cell(run['changes'])} level changes. Over "
              f"the whole ramp: goodput {num(w['goodput_qps'], 1)} req/s, admitted P99 "
              f"{opt(w['latency_ms'].get('p99'), 1)} ms, {num(w['shed_qps'], 1)} refused /s, answers "
              f"{_mix(w['levels'], names)}. The level over time: {_track(run['gauge'], names)}.")


def _comparison(d: dict) -> str:
    """Steer against shed at each load, from the table's own figures."""
    steps, lines = d["steady"]["steps"], []
    for factor in d["steady"]["factors"]:
        steer, shed = _step(steps, "steer", factor), _step(steps, "shed", factor)
        if steer is None or shed is None or not shed["goodput_qps"]:
            continue
        ratio = steer["goodput_qps"] / shed["goodput_qps"]
        lines.append(f"{factor:g}×: {num(ratio, 2)}× `shed`'s goodput at a mean nDCG@10 of "
                     f"{opt(steer['mean_ndcg'], 4)} against {opt(shed['mean_ndcg'], 4)}")
    return ("Steering against admission control alone, goodput and the ladder's quality of the answers: "
            + join_words(lines) + ".") if lines else ""


def steering(d: dict) -> str:
    data = d["steering"]
    ladder, names = data["ladder"], data["level_names"]
    rungs = table(["level", f"nDCG@10 on {ladder['corpus']}", "CPU ms per answer (ladder)"],
                  [[f"`{k}`", num(v, 4), opt(ladder["cpu_ms"].get(k), 3)]
                   for k, v in sorted(ladder["ndcg@10"].items(), key=lambda kv: names.index(kv[0]))], "lrr",
                  f"The ladder's rungs this service runs (rag/steering/ladder.json, `{ladder['command']}`): the "
                  f"quality each answer is credited with below.")
    checks = "\n".join(f"- {ask}: {_verdict(met)} ({figures})." for ask, met, figures in targets(data))
    configs = "\n".join(f"- `{name}`: {CONFIG_WORDS.get(name, name)} ("
                        + (", ".join(f"`{k}={v}`" for k, v in env.items()) or "no settings changed") + ")."
                        for name, env in data["configs"].items())
    return blocks(
        f"""\
Three `ragheat serve` processes over the same index, side by side, open-loop Poisson load from one generator on
the same cores (SciFact train claims), each step on each configuration in turn:

{configs}

Mean nDCG@10 is the ladder's: each answer is credited with the nDCG@10 its rung scored on {ladder['corpus']} when the
ladder was measured (`ragheat measure-ladder`), weighted by the rung's share of the answers. It is not measured on
these answers, and it counts answers only: a refused query has no quality at all.""",
        rungs, _knee(data), _steady(data), _starts(data), _comparison(data), _burst(data), _ramp(data),
        "Targets, checked against the figures above:\n\n" + checks)
