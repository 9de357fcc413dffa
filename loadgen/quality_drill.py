"""The quality SLO's drill: ``ragheat serve`` processes under the same steady load of the corpus's own questions,
scraped every second by one Prometheus that evaluates the rules (the test profile: hours become minutes), all
healthy for a stretch, then each hit by a fault that keeps every latency panel green:

- **a broken index generation published** into a service's index folder, as ingest publishes one (built aside,
  then the ``current`` link swapped; the service hot-swaps to it on its reload poll): its dense vectors rotated into
  another space, as if another encoder had built them (``rotate_dense_vectors``), or shuffled among the chunks
  (``shuffle_dense_vectors``);
- **out-of-domain traffic**: the healthy service's questions switch to another corpus's;
- **a redeploy** (``redeploys``): a service answering extractively is stopped and started again on its port with
  other settings, e.g. written answers from a model server serving random weights (what a model swapped for a worse
  one looks like, at a latency the SLO holds).

Each fault's detection time runs from its start (a redeploy's: once the new process answers) to the ``activeAt`` of
the first quality page (any of the alerts named) that fires for its job; the healthy stretch must page nobody, and no
latency page may be pending or firing at any point it is checked. Callers render the rules (the dashboards room) and
name the alerts; this module runs processes and load and reads Prometheus' HTTP API."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Mapping, Sequence

import httpx
import numpy as np

from loadgen.faults import OpenLoop
from stack.prometheus import LocalPrometheus
from stack.servers import ServeProcess

HEALTHY = "ragheat"
"""The scrape job of the service the out-of-domain questions reach; each other service is a job named by its fault."""


def _replace_vectors(path: Path, index, vectors: np.ndarray) -> Path:
    import faiss

    index.reset()
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))
    return path


def rotate_dense_vectors(generation: Path, seed: int = 0) -> Path:
    """In place: a generation folder's dense vectors (``dense.faiss``) multiplied by a random rotation, as if another
    encoder had embedded the passages; everything else (chunks, BM25, the reranker's token vectors) is left as it
    was. Returns the file. A flat or HNSW index only (they keep the vectors; IVF-PQ keeps codes)."""
    import faiss

    path = Path(generation) / "dense.faiss"
    index = faiss.read_index(str(path))
    rotation, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((index.d, index.d)))
    return _replace_vectors(path, index, index.reconstruct_n(0, index.ntotal) @ rotation.T.astype(np.float32))


def shuffle_dense_vectors(generation: Path, seed: int = 0) -> Path:
    """In place: a generation folder's dense vectors permuted among its chunks (each still a real passage vector, now
    under another chunk's id). Returns the file; flat or HNSW only, as ``rotate_dense_vectors``."""
    import faiss

    path = Path(generation) / "dense.faiss"
    index = faiss.read_index(str(path))
    vectors = index.reconstruct_n(0, index.ntotal)
    return _replace_vectors(path, index, vectors[np.random.default_rng(seed).permutation(len(vectors))])


@contextlib.contextmanager
def broken_generation(index_root: Path, breaks: Callable[[Path], Path]):
    """``with broken_generation(root, breaks) as publish:`` builds a copy of the served generation aside, broken by
    ``breaks``, as ingest builds one (``rag.index.store.IndexWriter``, holding the index's lock); ``publish()`` makes
    it durable and swaps the ``current`` link to it, the step a serving index sees. Nothing is published if the block
    ends without calling it."""
    from rag.index.store import CURRENT, MANIFEST, IndexWriter

    served = (Path(index_root) / CURRENT).resolve()
    manifest = json.loads((served / MANIFEST).read_text())
    with IndexWriter.open(Path(index_root)) as writer:
        for item in served.iterdir():
            if item.name != MANIFEST and item.is_file():
                shutil.copy2(item, writer.folder / item.name)
            elif item.is_dir():
                shutil.copytree(item, writer.folder / item.name)
        breaks(writer.folder)
        yield lambda: writer.publish({k: v for k, v in manifest.items() if k not in ("format_version", "generation")})


BREAKERS = {"another_encoder": rotate_dense_vectors, "shuffled_vectors": shuffle_dense_vectors}
"""Fault name -> what breaks a copy of the index for it."""
OUT_OF_DOMAIN = "out_of_domain"
RANDOM_MODEL = "random_weight_model"
"""The redeploy fault: written answers from a model server serving random weights (``written_answers_env``)."""


def written_answers_env(base_url: str) -> dict[str, str]:
    """The environment of a service writing its answers with the OpenAI-compatible server at ``base_url`` (``/v1``),
    sized for a small model's context of 512 tokens: one passage cut to its most relevant sentences, a short answer."""
    return {"RAGHEAT_GENERATION__GENERATOR": "openai", "RAGHEAT_GENERATION__BASE_URL": base_url,
            "RAGHEAT_GENERATION__PASSAGES": "1", "RAGHEAT_GENERATION__PROMPT_BUDGET_TOKENS": "120",
            "RAGHEAT_GENERATION__MAX_TOKENS": "16"}


@dataclass
class DrillRun:
    healthy_s: float = 0.0
    before: list[dict] = field(default_factory=list)  # pages pending or firing on any job after the healthy stretch
    fired_after_s: dict[str, float | None] = field(default_factory=dict)  # fault -> seconds to its first quality page
    alerts: dict[str, dict] = field(default_factory=dict)  # fault -> that page
    by_alert_s: dict[str, dict[str, float]] = field(default_factory=dict)  # fault -> each page seen while watching
    latency_pages: list[dict] = field(default_factory=list)  # latency pages pending or firing when checked
    verdicts: dict[str, dict[str, float]] = field(default_factory=dict)  # job -> answers by verdict at the end
    healthy_verdicts: dict[str, dict[str, float]] = field(default_factory=dict)  # the same when the faults began
    redeployed: list[str] = field(default_factory=list)  # jobs whose process was replaced: counters began anew

    def fault_verdicts(self, job: str) -> dict[str, float]:
        """A job's answers by verdict since the faults began."""
        before = {} if job in self.redeployed else self.healthy_verdicts.get(job, {})
        return {v: n - before.get(v, 0.0) for v, n in self.verdicts.get(job, {}).items()}


def _alerts(url: str) -> list[dict]:
    return httpx.get(url + "/api/v1/alerts", timeout=10).json()["data"]["alerts"]


def _unix(rfc3339: str) -> float:
    head, _, tail = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (tail or "0"))


def _verdicts(url: str, family: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    return {s.labels["verdict"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == family}


def _alert_key(alert: dict) -> str:
    labels = alert["labels"]
    return f'{labels["alertname"]}{{{labels.get("signal") or labels.get("burn", "")}}}'


def run_drill(healthy_index: Path, broken: Mapping[str, Path], questions: Path, other_questions: Path,
              rules_file: Path, *, quality_alerts: Sequence[str], latency_alert: str, verdict_family: str,
              redeploys: Mapping[str, Mapping[str, str]] | None = None,
              rate: float = 5.0, healthy_s: float = 65.0, fire_by_s: float = 120.0,
              env: Mapping[str, str] | None = None, progress: Callable[[str], None] = lambda message: None) -> DrillRun:
    """Run the drill (see the module). ``broken``: fault name (a key of ``BREAKERS``) -> a copy of the healthy index,
    served as a job of that name, into which the broken generation is published (``env`` should set a reload poll);
    ``redeploys``: fault name -> the environment a job of that name, serving the healthy index with ``env`` until
    then, is started again with on its port when the faults begin; ``quality_alerts``/``latency_alert``: the alerts'
    names (a page is one with ``severity="page"``); ``verdict_family``: the verdict counter's sample name, read off
    each service at the end."""
    redeploys = dict(redeploys or {})
    run = DrillRun(healthy_s=healthy_s)

    def pages(names: Sequence[str], job: str | None = None, states=("pending", "firing")) -> list[dict]:
        return [a for a in _alerts(prometheus) if a["labels"].get("alertname") in names and a["state"] in states
                and a["labels"].get("severity") == "page" and (job is None or a["labels"].get("job") == job)]

    def watch(faults: Mapping[str, float], deadline: float) -> None:
        """Record each fault's pages (its job's, since its start) until every fault paged or the deadline passed."""
        while time.time() < deadline:
            for alert in pages(quality_alerts, states=("firing",)):
                job = alert["labels"].get("job")
                fault = OUT_OF_DOMAIN if job == HEALTHY else job
                if fault not in faults:
                    continue
                seconds = _unix(alert["activeAt"]) - faults[fault]
                run.by_alert_s.setdefault(fault, {}).setdefault(_alert_key(alert), seconds)
                if run.fired_after_s.get(fault) is None or seconds < run.fired_after_s[fault]:
                    run.fired_after_s[fault], run.alerts[fault] = seconds, alert
            if all(run.fired_after_s.get(f) is not None for f in faults):
                return
            time.sleep(0.5)
        for fault in faults:
            run.fired_after_s.setdefault(fault, None)

    with contextlib.ExitStack() as stack:
        # Built before anything is timed: the fault is the swap, as it is when ingest publishes.
        publish = {fault: stack.enter_context(broken_generation(index, BREAKERS[fault]))
                   for fault, index in broken.items()}
        healthy = stack.enter_context(ServeProcess(healthy_index, env=env))
        services = {fault: stack.enter_context(ServeProcess(index, env=env)) for fault, index in broken.items()}
        redeployed = {fault: ServeProcess(healthy_index, env=env) for fault in redeploys}
        for service in redeployed.values():
            stack.enter_context(service)
        services.update(redeployed)
        progress("services up")
        prometheus = stack.enter_context(LocalPrometheus(
            healthy.url.removeprefix("http://"), scrape_interval_s=1, extra_config=f"rule_files:\n  - {rules_file}\n",
            extra_targets={fault: s.url.removeprefix("http://") for fault, s in services.items()}))
        load = stack.enter_context(OpenLoop(healthy.url, rate, questions))
        for service in services.values():
            stack.enter_context(OpenLoop(service.url, rate, questions))
        start = time.time()
        progress("load started, every service healthy")
        time.sleep(max(0.0, start + healthy_s - time.time()))
        run.before = pages([*quality_alerts, latency_alert])
        run.latency_pages += pages([latency_alert])
        urls = {HEALTHY: healthy.url, **{fault: s.url for fault, s in services.items()}}
        run.healthy_verdicts = {job: _verdicts(url, verdict_family) for job, url in urls.items()}
        progress(f"healthy stretch over ({len(run.before)} pages); the faults from now")
        other = [json.loads(line)["text"] for line in Path(other_questions).read_text().splitlines() if line.strip()]
        faulted = time.time()
        load.texts = other
        for swap in publish.values():
            swap()
        began = dict.fromkeys([*broken, OUT_OF_DOMAIN], faulted)
        for fault, deploy_env in redeploys.items():  # stopped, then the new one on its port: its load keeps coming
            old = redeployed[fault]
            old.child.stop()
            stack.enter_context(ServeProcess(healthy_index, env=deploy_env, port=old.port))
            began[fault] = time.time()  # its first answers: the fault is what it serves, not its restart
            run.redeployed.append(fault)
        progress("faults begun")
        watch(began, max(began.values()) + fire_by_s)
        run.latency_pages += pages([latency_alert])
        run.verdicts = {job: _verdicts(url, verdict_family) for job, url in urls.items()}
    return run
