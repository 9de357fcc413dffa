"""``ragheat tune``'s four steps as one resumable run: labels, the reranker's head, the model server's batch limits,
hardware-aware placement; the service's figures after each step beside the ones before it.

Everything lands in one folder: ``state.json`` (each step's inputs digest and result: a re-run with the same inputs
reuses a finished step, a changed input re-runs that step and the ones after it), ``settings.json`` (what
``ragheat serve --settings`` reads), ``artefacts/`` (a trained head), ``index/`` (the index ingested anew when a
new head is kept), ``labels/`` and ``logs/``, and the report (``report.json``, ``report.html``: tuning.report).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, ContextManager

from rag.eval.beir import Qrels, load_qrels, load_queries
from rag.index.store import read_manifest
from tuning import measure
from tuning.labels import Labels, choose_labels
from tuning.model_server_step import choose_model_limits
from tuning.model_server_load import ModelServerLoad, RunningModel, pin_tree
from tuning.placement_step import merge, model_server_cpus, tune_placement
from tuning.reranker_step import HELD_OUT_SHARE, split_queries, train_head
from tuning.written_answers import measure_written

STEPS = ("labels", "baseline", "reranker", "model_server", "placement")


@dataclass
class TuneRequest:
    """What to tune and how hard to measure it."""

    beir: Path  # corpus.jsonl, queries.jsonl and, when the user has them, qrels/<split>.tsv
    split: str
    index: Path
    out: Path
    labels: str = "auto"  # auto | human | judge (tuning.labels)
    judge_sample: int = 20  # beside human labels: queries the judge labels too, to measure it (0 = none)
    judge_threshold: float = 0.0
    queries_limit: int | None = None  # at most this many queries (drawn with seed) in every step
    llm_model: Path | None = None  # a model folder: step 3 sweeps vLLM's batch limits on it
    llm_grid: tuple[tuple[int, ...], tuple[int, ...]] = ((4, 8, 16), (1024, 2048))
    llm_duration_s: float = 20.0
    llm_load_format: str = "auto"  # dummy: random weights (tests)
    llm_rate: float = 2.0  # step 3's offered requests per second: the sweep's, and the written answers' load
    llm_slo_ms: tuple[float, float] = (1000.0, 10000.0)  # the model's objectives: TTFT P99, end-to-end P99
    llm_questions: int = 20  # questions per round of the written answers' concurrency-1 measurement
    rounds: int = 5
    rates: tuple[float, ...] = (40.0, 80.0, 120.0, 160.0, 200.0, 240.0, 280.0, 320.0)
    duration_s: float = 8.0
    target_qps: float = 40.0
    seed: int = 0
    epochs: int = 6
    knobs: tuple[str, ...] | None = None  # step 4 measures only these (tuning.placement_step.KNOBS); None: all

    def to_json(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


@dataclass
class TuneState:
    """``state.json``: each finished step's inputs digest and result."""

    path: Path
    steps: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "TuneState":
        if path.is_file():
            try:
                return cls(path, json.loads(path.read_text()).get("steps", {}))
            except ValueError:  # a run killed mid-write: start again
                pass
        return cls(path)

    def done(self, step: str, key: str) -> dict | None:
        entry = self.steps.get(step)
        return entry["result"] if entry and entry.get("key") == key else None

    def record(self, step: str, key: str, result: dict) -> None:
        self.steps[step] = {"key": key, "result": result, "finished_at": time.time()}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"steps": self.steps}, indent=2, sort_keys=True, default=str))
        tmp.replace(self.path)


def _not_measured(base: dict, candidate: dict) -> tuple[dict, dict]:
    raise AssertionError("step 4 (placement) measures no knob when none is asked for")


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


MEASURED_CODE = ("rag", "telemetry", "loadgen", "stack", "tuning")
"""The packages whose code the measured services and the measuring run: a change to any of them measures anew."""


def code_digest(root: Path = Path(__file__).resolve().parents[1]) -> str:
    """A digest of every module of ``MEASURED_CODE``: an upgraded checkout does not reuse the figures of the old one."""
    h = hashlib.sha256()
    for package in MEASURED_CODE:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def file_digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.is_file() else None


def write_qrels(path: Path, qrels: Qrels) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] + [f"{q}\t{d}\t{g}" for q, rel in sorted(qrels.items())
                                              for d, g in sorted(rel.items())]
    path.write_text("\n".join(lines) + "\n")


def read_qrels(path: Path) -> Qrels:
    qrels: Qrels = {}
    for line in path.read_text().splitlines()[1:]:
        q, d, g = line.split("\t")
        qrels.setdefault(q, {})[d] = int(g)
    return qrels


class TuneRun:
    """``TuneRun(request, ...).run()`` -> the report (a dict), every step recorded in ``request.out``.

    ``asker_factory``: a context manager factory giving the judge its model (None: no judge);
    ``pipeline_factory(index, settings_sections)``: an in-process ``RagPipeline`` for labelling and training;
    ``ingest(index, settings_sections)``: builds ``index`` from ``request.beir`` with those settings;
    ``llm_sweep(request)``: step 3's sweep results (``loadgen.vllm_tuning.run_tuning``);
    ``model_server(settings_sections)``: a context manager running the model server with those sections' limits:
    the one step 3's written answers go through, and the one beside the services step 4 measures
    (``tuning.model_server_load.RunningModel``)."""

    def __init__(self, request: TuneRequest, *, pipeline_factory: Callable, ingest: Callable,
                 asker_factory: Callable[[], ContextManager] | None = None, llm_sweep: Callable | None = None,
                 model_server: Callable[[dict], ContextManager[RunningModel]] | None = None,
                 log: Callable[[str], None] = print, advance: Callable[[], None] | None = None) -> None:
        self.request, self.log, self.advance = request, log, advance
        self.pipeline_factory, self.ingest, self.asker_factory, self.llm_sweep, self.model_server = \
            pipeline_factory, ingest, asker_factory, llm_sweep, model_server
        request.out.mkdir(parents=True, exist_ok=True)
        self.state = TuneState.load(request.out / "state.json")

    # -- inputs ---------------------------------------------------------------------------------------------------

    def _inputs(self) -> tuple[dict[str, str], Qrels | None]:
        r = self.request
        queries = load_queries(r.beir)
        qrels_file = r.beir / "qrels" / f"{r.split}.tsv"
        human = load_qrels(r.beir, r.split) if qrels_file.is_file() else None
        ids = sorted(q for q in queries if q in human) if human else sorted(queries)
        if r.queries_limit and r.queries_limit < len(ids):
            ids = sorted(random.Random(r.seed).sample(ids, r.queries_limit))
        if not ids:
            raise ValueError(f"{r.beir}: no query to tune on (queries.jsonl, qrels/{r.split}.tsv)")
        chosen = {q: queries[q] for q in ids}
        return chosen, ({q: human[q] for q in ids} if human else None)

    def _measure(self, configs: dict[str, tuple[Path, dict]], labels: Qrels | None,
                 before_round: Callable[[str], None] = lambda name: None) -> dict[str, dict]:
        """Each configuration (name -> (index, settings sections)) measured, side by side when there are several."""
        r = self.request
        files = {name: (index, measure.write_settings(r.out / "configs" / f"{name}.json", sections))
                 for name, (index, sections) in configs.items()}
        figures = measure.measure(files, self.queries, labels, self.texts, rounds=r.rounds, rates=r.rates,
                                  duration_s=r.duration_s, target_qps=r.target_qps, held_out=self.held_out,
                                  log_dir=r.out / "logs" / "-".join(configs), advance=self.advance,
                                  before_round=before_round)
        return {name: {"settings": configs[name][1], "index": str(configs[name][0]), **f.to_json()}
                for name, f in figures.items()}

    # -- the steps ------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        r = self.request
        self.queries, human = self._inputs()
        self.texts = list(self.queries.values())
        manifest = read_manifest(r.index)
        index_key = manifest.get("fingerprint"), manifest.get("generation")
        data_key = (file_digest(r.beir / "queries.jsonl"), file_digest(r.beir / "qrels" / f"{r.split}.tsv"),
                    sorted(self.queries))
        measure_key = (r.rounds, r.rates, r.duration_s, r.target_qps)

        key = digest("labels", data_key, r.labels, r.judge_sample, r.judge_threshold, r.seed, index_key)
        labels_result = self.state.done("labels", key)
        qrels_path = r.out / "labels" / "qrels.tsv"
        if labels_result is None or (labels_result["source"] != "none" and not qrels_path.is_file()):
            self.log("step 1: relevance labels")
            labels: Labels = choose_labels(
                human, self.queries, r.labels, pipeline_factory=lambda: self.pipeline_factory(r.index, {}),
                asker_factory=self.asker_factory, judge_sample=r.judge_sample, seed=r.seed,
                out_dir=r.out / "labels", threshold=r.judge_threshold, advance=self.advance)
            if labels.qrels:
                write_qrels(qrels_path, labels.qrels)
            labels_result = labels.to_json()
            self.state.record("labels", key, labels_result)
        qrels = read_qrels(qrels_path) if labels_result["source"] != "none" else None
        self.log(f"labels: {labels_result['reason']}")
        # The questions step 2 holds out: every measurement also scores them alone, so a head's gain is not read
        # off the questions it was trained on.
        labelled = [q for q in self.queries if qrels and any(g > 0 for g in qrels.get(q, {}).values())]
        self.held_out = frozenset(split_queries(labelled, HELD_OUT_SHARE, r.seed)[1]) if len(labelled) >= 3 \
            else frozenset()

        key_base = digest("baseline", key, index_key, measure_key, code_digest())  # labels survive an upgrade
        baseline = self.state.done("baseline", key_base)
        if baseline is None:
            self.log("measuring the service as it is")
            baseline = self._measure({"baseline": (r.index, {})}, qrels)["baseline"]
            self.state.record("baseline", key_base, baseline)

        key_rr = digest("reranker", key_base, r.epochs)
        reranker = self.state.done("reranker", key_rr)
        if reranker is None:
            reranker = self._reranker_step(qrels, baseline)
            self.state.record("reranker", key_rr, reranker)
        index, sections = Path(reranker["figures"]["index"]), reranker["figures"]["settings"]

        key_llm = digest("model_server", key_rr, str(r.llm_model), r.llm_grid, r.llm_duration_s, r.llm_load_format,
                         r.llm_rate, r.llm_slo_ms, r.llm_questions)
        llm = self.state.done("model_server", key_llm)
        if llm is None:
            llm = self._model_server_step(index, sections)
            self.state.record("model_server", key_llm, llm)
        sections = merge(sections, llm.get("settings", {}))

        key_pl = digest("placement", key_llm, sections, *(() if r.knobs is None else (sorted(r.knobs),)))
        placement = self.state.done("placement", key_pl)
        if placement is None:
            placement = self._placement_step(index, sections, qrels)
            self.state.record("placement", key_pl, placement)
        # Placement's settings: every earlier step's (the model server's limits included) with the knobs it kept.
        chosen = merge(placement["settings"], {"server": {"index_dir": str(index.resolve())}})
        settings_path = measure.write_settings(r.out / "settings.json", chosen)
        return {"request": r.to_json(), "labels": labels_result, "baseline": baseline, "reranker": reranker,
                "model_server": llm, "placement": placement, "settings_file": str(settings_path),
                "settings": chosen}

    def _reranker_step(self, qrels: Qrels | None, baseline: dict) -> dict:
        r = self.request
        if not qrels:
            return {"ran": False, "reason": "no usable relevance labels (step 1): nothing to train on",
                    "figures": baseline}
        self.log("step 2: training the reranker's head on the labels")
        pipeline = self.pipeline_factory(r.index, {})
        try:
            head_path = r.out / "artefacts" / "rerank-head.npz"
            head_path.parent.mkdir(parents=True, exist_ok=True)
            result = train_head(pipeline, self.queries, qrels, current_head=pipeline.settings.rerank.head,
                                out_path=head_path, held_out=self.held_out, split=r.split, epochs=r.epochs,
                                seed=r.seed, log=self.log, advance=self.advance)
        finally:
            pipeline.close()
        self.log(f"reranker: {result['reason']}")
        if not result["kept"]:
            return {"ran": True, **result, "figures": baseline}
        sections = {"rerank": {"head": str(head_path.resolve())}}
        index = r.out / "index"
        self.log(f"ingesting {r.beir} anew into {index} with the new head's token vectors")
        self.ingest(index, sections)
        pair = self._measure({"reranker-before": (r.index, {}), "reranker": (index, sections)}, qrels)
        return {"ran": True, **result, "figures": pair["reranker"], "before": pair["reranker-before"]}

    def _model_server_step(self, index: Path, sections: dict) -> dict:
        r = self.request
        if r.llm_model is None or self.llm_sweep is None:
            return {"ran": False, "reason": "no model server configured (--llm-model): the batch sweep is skipped"}
        self.log("step 3: sweeping the model server's batch limits")
        result = choose_model_limits(self.llm_sweep(r))
        if self.model_server is not None:
            self.log("step 3: the service writing its answers through the model server, before and after")
            result["written"] = measure_written(
                sections, merge(sections, result.get("settings", {})), self.model_server, index,
                self.texts[: r.llm_questions], rounds=r.rounds, rate=r.llm_rate, duration_s=r.llm_duration_s,
                deadline_ms=r.llm_slo_ms[1], out=r.out, advance=self.advance)
        return result

    def _placement_step(self, index: Path, sections: dict, qrels: Qrels | None) -> dict:
        r = self.request
        self.log("step 4: hardware-aware placement")
        if r.knobs == ():  # nothing asked for: the service stays as the steps before left it, measured there
            result = tune_placement(sections, _not_measured, model_server=r.llm_model is not None, asked=frozenset(),
                                    log=self.log)
            return {**result, "figures": self.state.steps["reranker"]["result"]["figures"]}
        if r.llm_model is None or self.model_server is None:
            return self._place(index, sections, qrels, None)
        self.log("step 4: the model server runs beside the measured services, under load")
        with self.model_server(sections) as model, ModelServerLoad(model, self.texts) as load:
            started = time.monotonic()
            result = self._place(index, sections, qrels, model)
            result["model_server_load"] = load.summary(time.monotonic() - started)
        return result

    def _place(self, index: Path, sections: dict, qrels: Qrels | None, beside: RunningModel | None) -> dict:
        r = self.request
        counter = iter(range(1000))
        before = self.state.steps.get("reranker", {}).get("result", {}).get("figures") or {}
        # Each knob also side by side under load: at the knee measured before this step (the target rate without one);
        # with the model server beside the service, at the knee measured beside it, which takes the cores it uses.
        load_qps = before.get("knee_qps") or r.target_qps
        knee_beside = None
        if beside is not None:
            self.log("step 4: the knee with the model server beside the service")
            knee_beside, _ = measure.knee_of(index, measure.write_settings(r.out / "configs" / "placement-knee.json",
                                                                           sections),
                                             self.texts, rates=r.rates, duration_s=r.duration_s,
                                             log_dir=r.out / "logs" / "placement-knee")
            load_qps = knee_beside or r.target_qps

        def pin_beside(configs: dict[str, dict]) -> Callable[[str], None]:
            """Before a configuration's round, the model server onto the cores that configuration leaves it."""
            def pin(name: str) -> None:
                if beside is not None and pin_tree(beside.pid, model_server_cpus(configs[name])) == 0:
                    raise ValueError(f"step 4: the model server (pid {beside.pid}) is gone: its log is in "
                                     f"{r.out / 'logs'} (model-server-*-{beside.max_num_seqs}x{beside.max_model_len})")
            return pin

        def measure_pair(base: dict, candidate: dict) -> tuple[dict, dict]:
            n = next(counter)
            files = {"without": measure.write_settings(r.out / "configs" / f"placement-{n}-without.json", base),
                     "with": measure.write_settings(r.out / "configs" / f"placement-{n}-with.json", candidate)}
            pair = measure.compare(index, files, self.texts, rounds=r.rounds, log_dir=r.out / "logs" / f"placement-{n}",
                                   load_qps=load_qps, load_duration_s=r.duration_s, advance=self.advance,
                                   before_round=pin_beside({"without": base, "with": candidate}))
            return pair["without"], pair["with"]

        def lone_query_threads(config: dict) -> int:
            """What the configuration's own service runs a lone query on here (its /readyz)."""
            n = next(counter)
            return measure.lone_query_threads(
                index, measure.write_settings(r.out / "configs" / f"placement-{n}-lone.json", config),
                r.out / "logs" / f"placement-{n}-lone")

        asked = None if r.knobs is None else frozenset(r.knobs)
        result = tune_placement(sections, measure_pair, model_server=beside is not None, asked=asked,
                                lone_query_threads=lone_query_threads, log=self.log)
        result["load_qps"] = load_qps
        if beside is not None:
            result["knee_beside_model_server"] = knee_beside
        if result["settings"] == sections and before and beside is None:
            return {**result, "figures": before}  # nothing kept: the service measured after the previous step
        configs = {"placement-before": sections, "placement": result["settings"]}
        pair = self._measure({name: (index, c) for name, c in configs.items()}, qrels, pin_beside(configs))
        return {**result, "figures": pair["placement"], "before": pair["placement-before"]}
