"""What a configuration of the service delivers, measured over HTTP on real ``ragheat serve`` processes: quality
(nDCG@10 of the served ranking against the run's labels), each stage's and the whole request's P50/P99 at
concurrency 1, the knee (the highest offered rate whose P99 meets the SLO) and the P99 at a target rate.

Configurations are JSON settings files (``RAGHEAT_SETTINGS_FILE``), served side by side by one ``ServeFleet`` and
loaded in turn, one at a time, so that each round of one is next to a round of the other under the same conditions
of the machine. The answer cache is off and the load controller pinned at full quality in every measured server:
tuning compares the path a new question takes, and a controller that cut stages under load would move the knee by
a different mechanism than the one measured.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx
import numpy as np

from loadgen.http_target import HttpTarget
from loadgen.runner import open_loop, run
from loadgen.stats import find_knee
from rag.eval.beir import Qrels, score_run
from rag.settings import SETTINGS_FILE_ENV
from rag.slo import SLO_MS
from stack.servers import ServeFleet

MEASURED_ENV = {"RAGHEAT_CACHE__ENABLED": "false", "RAGHEAT_STEERING__ENABLED": "false"}
"""Every measured server: no answer cache (a repeated question would be a lookup), no load controller."""
RANKED_DOCS = 10
RANKED_CHUNKS = 30  # chunks asked for, so that ten distinct documents remain after merging a document's chunks


@dataclass
class Rounds:
    """Concurrency-1 rounds of one configuration: each round's P50 and P99 of the whole request (client side) and
    of each stage (the response's own timings), in ms; and the answers by who wrote them (``answered_by``)."""

    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    stages: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # stage -> {"p50": [...], "p99": [...]}
    answers: Counter = field(default_factory=Counter)

    def add(self, latencies_ms: Sequence[float], stages_ms: Mapping[str, Sequence[float]],
            answers: Mapping[str, int] | None = None) -> None:
        self.answers.update(answers or {})
        self.p50_ms.append(float(np.percentile(latencies_ms, 50)))
        self.p99_ms.append(float(np.percentile(latencies_ms, 99)))
        for stage, values in stages_ms.items():
            entry = self.stages.setdefault(stage, {"p50": [], "p99": []})
            entry["p50"].append(float(np.percentile(values, 50)))
            entry["p99"].append(float(np.percentile(values, 99)))

    def summary(self) -> dict:
        """Median over the rounds, and their spread (max - min), of each figure."""
        def med(values: Sequence[float]) -> dict:
            return {"median": float(np.median(values)), "spread": float(max(values) - min(values)),
                    "rounds": [round(v, 3) for v in values]}

        return {"p50_ms": med(self.p50_ms), "p99_ms": med(self.p99_ms),
                "stages": {s: {"p50_ms": float(np.median(v["p50"])), "p99_ms": float(np.median(v["p99"]))}
                           for s, v in self.stages.items()},
                "answers": dict(self.answers)}


@dataclass
class Figures:
    """One configuration's figures, as a report shows them after a step."""

    ndcg10: float | None
    concurrency_1: dict
    ndcg10_held_out: float | None = None  # over the questions step 2 holds out (none of them trained on)
    knee_qps: float | None = None
    knee_is_lower_bound: bool = False  # the highest rate offered met the SLO: the knee lies at or above it
    target_qps: float | None = None
    p99_at_target_ms: float | None = None
    sweep: list = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def write_settings(path: Path, sections: Mapping[str, Mapping]) -> Path:
    """A settings file (sections -> fields) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: dict(v) for k, v in sections.items() if v}, indent=2, sort_keys=True))
    return path


def _ask(client: httpx.Client, url: str, text: str, top_k: int) -> tuple[float, dict]:
    start = time.perf_counter()
    response = client.post(url + "/v1/query", json={"query": text, "top_k": top_k})
    elapsed = (time.perf_counter() - start) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"the measured service answered {response.status_code}: {response.text[:300]}")
    return elapsed, response.json()


def served_ndcg(url: str, queries: Mapping[str, str], qrels: Qrels,
                held_out: frozenset[str] = frozenset()) -> tuple[float, float | None]:
    """nDCG@10 of the documents the service returns, in its order, for every labelled query, and for those of
    ``held_out`` alone (None without any)."""
    judged = {qid: text for qid, text in queries.items() if qid in qrels}
    ranked: dict[str, list[str]] = {}
    with httpx.Client(timeout=60) as client:
        for qid, text in judged.items():
            _, body = _ask(client, url, text, RANKED_CHUNKS)
            docs = list(dict.fromkeys(c["doc_id"] for c in body["citations"]))
            ranked[qid] = docs[:RANKED_DOCS]
    held = {q: qrels[q] for q in judged if q in held_out}
    return (float(score_run(ranked, {q: qrels[q] for q in judged})["ndcg@10"]),
            float(score_run(ranked, held)["ndcg@10"]) if held else None)


def answered_by(body: dict) -> str:
    """Who wrote an answer: its generator, and why it fell back when it did (``extractive (slow)``)."""
    reason = body.get("degraded_reason")
    return f"{body.get('generator', '?')} ({reason})" if reason else str(body.get("generator", "?"))


def one_round(url: str, texts: Sequence[str]) -> tuple[list[float], dict[str, list[float]], dict[str, int]]:
    """Every text once, one at a time: the whole request's ms, each stage's, and the answers by writer."""
    latencies, stages, answers = [], {}, Counter()
    with httpx.Client(timeout=60) as client:
        for text in texts:
            elapsed, body = _ask(client, url, text, 5)
            latencies.append(elapsed)
            for stage in body.get("stages", []):
                stages.setdefault(stage["name"], []).append(float(stage["ms"]))
            answers[answered_by(body)] += 1
    return latencies, stages, dict(answers)


def _nothing(name: str) -> None:
    return None


def side_by_side(fleet_urls: Mapping[str, str], texts: Sequence[str], rounds: int,
                 advance: Callable[[], None] | None = None,
                 before_round: Callable[[str], None] = _nothing) -> dict[str, Rounds]:
    """``rounds`` concurrency-1 rounds of each configuration, alternating (A B, B A, ...) so that a drift of the
    machine falls on both; one unmeasured pass each first (connection set-up, lazily built state).
    ``before_round(name)`` runs before each of that configuration's rounds (what lies beside it changes with it)."""
    names = list(fleet_urls)
    for name in names:
        before_round(name)
        one_round(fleet_urls[name], texts[: max(1, len(texts) // 4)])
    measured = {name: Rounds() for name in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            before_round(name)
            measured[name].add(*one_round(fleet_urls[name], texts))
            if advance:
                advance()
    return measured


def knee_sweep(url: str, texts: Sequence[str], rates: Sequence[float], duration_s: float,
               slo_ms: float = SLO_MS, seed: int = 0) -> tuple[float | None, list]:
    """Open-loop steps at ``rates`` (rising; stops after the first two steps past the SLO): the knee, and each
    step's offered rate, achieved rate, P99 and errors."""
    steps, past, address = [], 0, HttpTarget().url(url)
    for i, rate in enumerate(sorted(rates)):
        step = run(open_loop(address, list(texts), rate, duration_s, min(2.0, duration_s / 2), seed=seed + i,
                             want_stages=False, slo_ms=slo_ms))
        steps.append(step)
        if (step.latency_ms.get("p99") or float("inf")) > slo_ms or step.error_rate > 0.001:
            past += 1
            if past == 2:
                break
    table = [{"offered_qps": s.offered_qps, "achieved_qps": round(s.achieved_qps, 2),
              "p99_ms": s.latency_ms.get("p99"), "errors": s.errors, "shed": s.shed,
              "error_reasons": getattr(s, "error_reasons", {})} for s in steps]
    return find_knee(steps, slo_ms), table


def measured_env(settings_file: Path) -> dict[str, str | None]:
    """A measured server's environment overrides: the settings file named, and any ``RAGHEAT_<SECTION>__<FIELD>``
    of this process that the file sets removed (the environment would win over the file, and the server would not
    run the configuration measured)."""
    path = Path(settings_file).resolve()
    sections = json.loads(path.read_text())
    shadowing = {f"RAGHEAT_{section.upper()}__{name.upper()}": None
                 for section, fields in sections.items() for name in fields}
    return {**shadowing, **MEASURED_ENV, SETTINGS_FILE_ENV: str(path)}


def measure(configs: Mapping[str, tuple[Path, Path]], queries: Mapping[str, str], qrels: Qrels | None,
            texts: Sequence[str], *, rounds: int, rates: Sequence[float], duration_s: float, target_qps: float,
            log_dir: Path, held_out: frozenset[str] = frozenset(), advance: Callable[[], None] | None = None,
            before_round: Callable[[str], None] = _nothing) -> dict[str, Figures]:
    """Every figure of each configuration (name -> (index, settings file)), all served at once by one fleet: the
    concurrency-1 rounds alternate between them, the sweeps and the target-rate steps run one configuration after
    the other, so that a step's figures beside the step before it come from the same minutes of the machine."""
    first = next(iter(configs.values()))[0]
    env = {name: ((), measured_env(path)) for name, (_, path) in configs.items()}
    with ServeFleet(first, env, log_dir, indexes={name: index for name, (index, _) in configs.items()}) as fleet:
        c1 = {name: r.summary() for name, r in side_by_side(fleet.urls, texts, rounds, advance, before_round).items()}
        figures = {}
        for name, url in fleet.urls.items():
            before_round(name)
            ndcg, held = served_ndcg(url, queries, qrels, held_out) if qrels else (None, None)
            knee, sweep = knee_sweep(url, texts, rates, duration_s)
            at_target = run(open_loop(HttpTarget().url(url), list(texts), target_qps, duration_s,
                                      min(2.0, duration_s / 2), seed=99, want_stages=False))
            figures[name] = Figures(ndcg, c1[name], held, knee, knee is not None and knee >= max(rates),
                                    target_qps, at_target.latency_ms.get("p99"), sweep)
    return figures


def at_load(urls: Mapping[str, str], texts: Sequence[str], qps: float, duration_s: float, rounds: int,
            before_round: Callable[[str], None] = _nothing) -> dict:
    """Each configuration's P99 under open-loop load at ``qps``, ``rounds`` alternating steps each: median and
    spread per configuration."""
    names, p99 = list(urls), {name: [] for name in urls}
    outcomes = {name: {"answered": 0, "shed": 0, "errors": 0} for name in urls}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            before_round(name)
            step = run(open_loop(HttpTarget().url(urls[name]), list(texts), qps, duration_s,
                                 min(2.0, duration_s / 2), seed=r, want_stages=False))
            # failing requests, or none answered (all refused, or none sent in the measured part): the worst P99
            p99_ms = step.latency_ms.get("p99") if step.error_rate <= 0.001 else None
            p99[name].append(float("inf") if p99_ms is None else p99_ms)
            outcomes[name]["shed"] += step.shed
            outcomes[name]["errors"] += step.errors
            outcomes[name]["answered"] += step.requests - step.shed - step.errors
    return {name: {"qps": qps, "p99_ms": {"median": float(np.median(v)), "spread": float(max(v) - min(v)),
                                          "rounds": [round(x, 3) for x in v]}, **outcomes[name]}
            for name, v in p99.items()}


def lone_query_threads(index: Path, settings_file: Path, log_dir: Path) -> int:
    """The threads one configuration's service runs a lone query on, on this machine (its ``/readyz``
    ``embedding.lone_query_threads``: its encoder's own choice, with the service's cores and precision)."""
    with ServeFleet(index, {"readyz": ((), measured_env(settings_file))}, log_dir) as fleet:
        ready = httpx.get(f"{fleet.urls['readyz']}/readyz", timeout=30.0).json()
    return int(ready["embedding"]["lone_query_threads"])


def knee_of(index: Path, settings_file: Path, texts: Sequence[str], *, rates: Sequence[float], duration_s: float,
            log_dir: Path) -> tuple[float | None, list]:
    """One configuration's knee (``knee_sweep``) on a server of its own: the rate its knobs are compared at when
    what lies beside the service changed since the last knee was measured."""
    with ServeFleet(index, {"knee": ((), measured_env(settings_file))}, log_dir) as fleet:
        return knee_sweep(fleet.urls["knee"], texts, rates, duration_s)


def compare(index: Path, settings_files: Mapping[str, Path], texts: Sequence[str], *, rounds: int, log_dir: Path,
            load_qps: float | None = None, load_duration_s: float = 8.0, load_rounds: int = 2,
            advance: Callable[[], None] | None = None,
            before_round: Callable[[str], None] = _nothing) -> dict[str, dict]:
    """Configurations side by side at concurrency 1 (``side_by_side``), each on its own server, all loaded at once;
    with ``load_qps``, also their P99 under that open-loop load (``at_load``, under ``"at_load"``)."""
    configs = {name: ((), measured_env(path)) for name, path in settings_files.items()}
    with ServeFleet(index, configs, log_dir) as fleet:
        measured = {name: r.summary()
                    for name, r in side_by_side(fleet.urls, texts, rounds, advance, before_round).items()}
        if load_qps:
            for name, figures in at_load(fleet.urls, texts, load_qps, load_duration_s, load_rounds,
                                         before_round).items():
                measured[name]["at_load"] = figures
    return measured
