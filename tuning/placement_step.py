"""Step 4: hardware-aware placement. Each knob is served side by side with the configuration so far, several
rounds at concurrency 1, and kept only when it lowers the median P99 by more than the rounds' spread on either side
without raising the median P50 beyond it; a kept knob is part of the baseline the next one is measured against.

The knobs (rag/placement.py and the embedding settings): the ONNX Runtime threads of a lone query, FAISS's OpenMP
threads (BLAS's are one always), the index memory locked or on huge pages, and, when a model server runs beside the
service, the two on separate core sets (``placement.cpus`` for the service, the rest of the cores for the model
server) against both on every core. A knob the host cannot serve (no transparent huge pages, memory it may not lock,
a single core) is
reported with the reason and not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from rag.placement import format_cpu_list, host_capabilities, parse_cpu_list, usable_cpus


@dataclass(frozen=True)
class Knob:
    """One candidate change: its name, the settings it adds (section -> fields) and what it does, in words."""

    name: str
    settings: Mapping[str, Mapping]
    what: str


KNOBS = ("lone_query_threads_1", "faiss_threads_1", "memory_lock", "memory_hugepages", "separate_cores")
"""Every knob step 4 knows, in the order it measures them (``--knobs`` picks among them)."""


def candidate_knobs(capabilities: dict, model_server: bool,
                    asked: frozenset[str] | None = None) -> tuple[list[Knob], dict[str, str]]:
    """The knobs worth measuring on this host, and those that are not, each with the reason; ``asked``: only these
    knobs (None: every one), the others skipped as not asked for."""
    knobs = [Knob("lone_query_threads_1", {"embedding": {"quiet_query_threads": 1}},
                  "a query alone in the model runs its encoder on one ONNX Runtime thread (without: on every core "
                  "where they ran it clearly faster when timed at the first start on this CPU)"),
             Knob("faiss_threads_1", {"placement": {"math_threads": 1}}, "FAISS searches on one OpenMP thread")]
    # Not a knob: the reranker's numpy products run on the request's own thread by design (rag/rerank/maxsim.py).
    skipped: dict[str, str] = {"blas_threads": "BLAS always runs on one thread (a product that fans out across the "
                                               "cores only waits for them: docs/benchmarks.md, \"Late-interaction "
                                               "reranker: what it costs\")"}
    lacks = capabilities["lacks"]
    if "memory_lock" in lacks:
        skipped["memory_lock"] = lacks["memory_lock"]
    else:
        knobs.append(Knob("memory_lock", {"placement": {"memory": "lock"}},
                          "every page the warm service maps (index, token vectors, models) faulted in and locked"))
    if "huge_pages" in lacks:
        skipped["memory_hugepages"] = lacks["huge_pages"]
    else:
        knobs.append(Knob("memory_hugepages", {"placement": {"memory": "hugepages"}},
                          "the token vectors copied into memory advised for transparent huge pages"))
    cpus = sorted(usable_cpus())
    if len(cpus) < 2:
        skipped["separate_cores"] = "a single core: nothing to keep apart"
    elif not model_server:
        skipped["separate_cores"] = ("no model server runs beside the service: its threads already have every core, "
                                     "and a smaller set would only take cores away")
    else:
        service = format_cpu_list(cpus[: max(1, len(cpus) // 2)])
        knobs.append(Knob("separate_cores", {"placement": {"cpus": service}},
                          f"the service's threads on cores {service}, the model server's on "
                          f"{format_cpu_list(cpus[max(1, len(cpus) // 2):])} (without: both on every core)"))
    for name, reason in lacks.items():
        if name in ("isolated_cores", "cache_allocation"):
            skipped[name] = reason
    if asked is not None:
        skipped.update({k.name: "not asked for (--knobs)" for k in knobs if k.name not in asked})
        knobs = [k for k in knobs if k.name in asked]
    return knobs, skipped


def model_server_cpus(sections: Mapping[str, Mapping]) -> frozenset[int]:
    """The cores the model server beside a configuration gets: those its ``placement.cpus`` leaves to others, or
    every core when it sets none."""
    everything = usable_cpus()
    service = sections.get("placement", {}).get("cpus")
    return (everything - parse_cpu_list(service)) or everything if service else everything


def merge(base: Mapping[str, Mapping], extra: Mapping[str, Mapping]) -> dict[str, dict]:
    """Settings sections ``base`` with ``extra``'s fields laid over them."""
    merged = {k: dict(v) for k, v in base.items()}
    for section, fields in extra.items():
        merged.setdefault(section, {}).update(fields)
    return merged


def decide(baseline: dict, candidate: dict) -> tuple[bool, str]:
    """Whether a knob is kept, from both sides' concurrency-1 summaries (``tuning.measure.Rounds.summary``) and,
    when measured, their P99 under load (``at_load``): a knob that wins alone but loses under load beyond the spread
    is not kept."""
    b99, c99 = baseline["p99_ms"], candidate["p99_ms"]
    b50, c50 = baseline["p50_ms"], candidate["p50_ms"]
    noise99 = max(b99["spread"], c99["spread"])
    noise50 = max(b50["spread"], c50["spread"])
    gain99, gain50 = b99["median"] - c99["median"], b50["median"] - c50["median"]
    words = (f"P99 {b99['median']:.2f} -> {c99['median']:.2f} ms (spread {noise99:.2f}), "
             f"P50 {b50['median']:.2f} -> {c50['median']:.2f} ms (spread {noise50:.2f})")
    worse_at_load = False
    if "at_load" in baseline and "at_load" in candidate:
        bl, cl = baseline["at_load"]["p99_ms"], candidate["at_load"]["p99_ms"]
        worse_at_load = cl["median"] - bl["median"] > max(bl["spread"], cl["spread"])
        words += (f"; P99 at {baseline['at_load']['qps']:g} req/s {bl['median']:.1f} -> {cl['median']:.1f} ms "
                  f"(spread {max(bl['spread'], cl['spread']):.1f})")
    if worse_at_load:
        return False, "not kept, slower under load: " + words
    if gain99 > noise99 and gain50 >= -noise50:
        return True, "kept: " + words
    if abs(gain99) <= noise99 and abs(gain50) <= noise50:
        return False, "no measurable effect: " + words
    return False, "not kept: " + words


def tune_placement(base: Mapping[str, Mapping], measure_pair: Callable[[dict, dict], tuple[dict, dict]], *,
                   model_server: bool, asked: frozenset[str] | None = None,
                   lone_query_threads: Callable[[Mapping[str, Mapping]], int] | None = None,
                   log: Callable[[str], None] = lambda _: None) -> dict:
    """Every knob in turn (of ``asked``, None: all) against the configuration so far (``measure_pair(base,
    candidate)`` serves both side by side and returns their summaries); the settings kept and each knob's figures
    and verdict. ``lone_query_threads(settings)``: the threads a configuration's encoder runs a lone query on (its
    own timing decides them on this CPU); a knob that leaves them as they are serves the same thing twice, and is
    skipped."""
    capabilities = host_capabilities()
    knobs, skipped = candidate_knobs(capabilities, model_server, asked)
    current = merge(base, {})
    results = []
    for knob in knobs:
        candidate = merge(current, knob.settings)
        if candidate == current:
            skipped[knob.name] = "already the configuration's setting"
            continue
        if knob.name == "lone_query_threads_1" and lone_query_threads is not None:
            threads = lone_query_threads(current)
            if threads == lone_query_threads(candidate):
                skipped[knob.name] = (f"the configuration's encoder already runs a lone query on {threads} thread(s) "
                                      f"on this CPU (its own timing chose it: /readyz embedding.lone_query_threads)")
                continue
        baseline_figures, candidate_figures = measure_pair(current, candidate)
        kept, verdict = decide(baseline_figures, candidate_figures)
        log(f"placement {knob.name}: {verdict}")
        results.append({"knob": knob.name, "what": knob.what, "settings": knob.settings, "kept": kept,
                        "verdict": verdict, "without": baseline_figures, "with": candidate_figures})
        if kept:
            current = candidate
    return {"capabilities": capabilities, "knobs": results, "skipped": skipped, "settings": current}

