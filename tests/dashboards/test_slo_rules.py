"""The committed Prometheus rules and Alertmanager config, checked by the real promtool and amtool, and the
burn-rate alerts unit-tested by ``promtool test rules`` on synthetic series built from the metrics contract."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml
from prometheus_client.utils import floatToGoString

from dashboards import contract, render, slo, yamlout
from rag.stages import DEFAULT_STAGES, STAGES
from telemetry.buckets import UNIT_SCORES
from telemetry.metrics import ROUTES
from tests.dashboards.promtool_kit import ALERTMANAGER, promtool_test, run, tool


@pytest.mark.parametrize("profile", list(slo.PROFILES))
def test_promtool_accepts_the_rules(profile, tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(render.rendered_files(slo.PROFILES[profile])[render.RULES_FILE])
    result = run(tool("promtool"), "check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rejects_a_broken_rule(tmp_path):
    """The check above can fail: a rule with a PromQL syntax error is refused."""
    rules = slo.prometheus_rules(slo.PRODUCTION)
    rules["groups"][0]["rules"][0]["expr"] += " +"
    path = tmp_path / "rules.yml"
    path.write_text(yamlout.dump(rules))
    result = run(tool("promtool"), "check", "rules", str(path))
    assert result.returncode != 0


def test_amtool_accepts_the_config_and_routes_pages_and_tickets():
    amtool = tool("amtool")
    result = run(amtool, "check-config", str(ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    for slo_name in ("latency", "quality"):
        for severity in ("page", "ticket"):
            routed = run(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}",
                         f"severity={severity}", f"slo={slo_name}")
            assert routed.returncode == 0, routed.stdout + routed.stderr
            assert routed.stdout.split() == [severity], routed.stdout
    # The quality alerts match a route of their own (the same receivers), the first one tried.
    quality = yaml.safe_load(ALERTMANAGER.read_text())["route"]["routes"][0]
    assert quality["matchers"] == ['slo="quality"']
    assert [(r["matchers"], r["receiver"]) for r in quality["routes"]] == [(['severity="page"'], "page"),
                                                                          (['severity="ticket"'], "ticket")]


def notification(tmp_path: Path, labels: dict, annotations: dict) -> Callable[[str], list[str]]:
    """The notification template as Alertmanager loads it (check-config reads the templates the config names) and as
    a chat or e-mail receiver would write a page: amtool 0.25's ``template render`` on a webhook payload's data.
    Returns a function rendering one template name to its lines."""
    amtool = tool("amtool")
    targets = render.Targets(alertmanager_templates=str(tmp_path / "alertmanager"))
    render.write(tmp_path, slo.PRODUCTION, targets)
    config = tmp_path / render.ALERTMANAGER_FILE
    checked = run(amtool, "check-config", str(config))
    assert checked.returncode == 0 and "1 templates" in checked.stdout, checked.stdout + checked.stderr
    data = tmp_path / "page.json"
    data.write_text(json.dumps({
        "receiver": "page", "status": "firing", "externalURL": "http://alertmanager:9093",
        "alerts": [{"status": "firing", "labels": labels, "annotations": annotations, "fingerprint": "1",
                    "startsAt": "2025-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z", "generatorURL": ""}],
        "groupLabels": {"alertname": labels["alertname"]}, "commonLabels": labels, "commonAnnotations": annotations}))

    def rendered(name: str) -> list[str]:
        result = run(amtool, "template", "render", f"--template.glob={tmp_path / render.NOTIFICATION_FILE}",
                     f'--template.text={{{{ template "{name}" . }}}}', f"--template.data={data}")
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip().splitlines()

    return rendered


def test_amtool_renders_the_cause_first(tmp_path):
    labels = {"alertname": "RagheatLatencyBudgetBurn", "job": JOB, "severity": "page", "slo": "latency"}
    annotations = {"cause": "io", "cause_evidence": "706 ms of stage P99 growth over 5m against the 1h before",
                   "stage": "embed", "stage_evidence": "embed has the highest P99", "summary": "the summary",
                   "description": "the objective"}
    rendered = notification(tmp_path, labels, annotations)
    assert rendered("ragheat.title") == [f"[FIRING] RagheatLatencyBudgetBurn {JOB}: cause io"]
    text = rendered("ragheat.text")
    assert text[:2] == ["cause: io: 706 ms of stage P99 growth over 5m against the 1h before",
                        "stage: embed: embed has the highest P99"], text
    assert text[-1] == f"the whole evidence: ragheat explain --prometheus URL --job {JOB} --window 5m", text


def test_amtool_renders_a_quality_page_with_its_verdict_and_drift(tmp_path):
    """A quality alert names no stage and no cause: its verdict and the similarity's drift come first."""
    labels = {"alertname": "RagheatQualityBudgetBurn", "job": JOB, "severity": "page", "slo": "quality"}
    annotations = {"verdict": "no_good_passage", "verdict_evidence": "no_good_passage: 4.8 answers/s of 10 scored",
                   "drift": "median best_similarity 0.55 over 30m against 0.64", "summary": "the summary",
                   "description": "the objective"}
    rendered = notification(tmp_path, labels, annotations)
    assert rendered("ragheat.title") == [f"[FIRING] RagheatQualityBudgetBurn {JOB}: verdict no_good_passage"]
    assert rendered("ragheat.text") == [
        "verdict: no_good_passage: no_good_passage: 4.8 answers/s of 10 scored",
        "drift: median best_similarity 0.55 over 30m against 0.64", "the summary", "the objective"]


# --- promtool unit tests -------------------------------------------------------------------------------------
# Synthetic traffic is built here from phases; what the alerts must say is written out literally below (labels,
# summary, description, the stage and the evidence with its numbers), never derived from dashboards.slo.

PER_MINUTE = 600  # requests per minute of synthetic traffic (10/s)
JOB = "ragheat-api"  # the scrape job of the service, as compose names it
LIBRARY_JOB = "rag-lib"  # a second service whose only ragheat part is the instrumentation library
LIBRARY_STAGES = ("embed", "retrieve", "tool", "other")  # its own names: a retriever of unknown kind, a tool call
HEALTHY_HISTORY = 370  # minutes: more than the 6 h window, so the 6 h ratios start from a healthy past
FAST_S = 0.005  # what a healthy stage takes
EDGES = ("0.0075", "0.2", "0.35", "0.42", "0.5", "2.5", "5", "+Inf")  # edges of telemetry.buckets, 0.42 among them
REQUEST_FAST_S, REQUEST_SLOW_S = 0.1, 0.45  # a healthy answer end to end, and one slower than 420 ms
HOST, HOST_CORES = "api:8000", 8  # the scraped instance and its cores


@dataclass(frozen=True)
class Phase:
    """``minutes`` of traffic at ``load`` times PER_MINUTE: the share of requests slower than 420 ms end to end (``slow``) and
    failing with a 5xx in ``failing`` (``failed``); ``stages`` lists, per stage, (share of requests, seconds) of
    executions that are not the healthy FAST_S. Extractive stages run in every answered request; the LLM stages
    (generate_prefill, generate_decode, support_check) only in the shares listed."""

    minutes: int
    slow: float = 0.0
    failed: float = 0.0
    failing: str = ""
    stages: tuple[tuple[str, float, float], ...] = ()
    load: float = 1.0  # requests per minute, as a multiple of PER_MINUTE
    process_cores: float = 1.0  # the host's CPU and stalls, written out by traffic(host=True) only
    others_cores: float = 0.5
    system_cores: float = 0.0  # of the others' cores, those the kernel spent (reclaim among them)
    stalled: tuple[tuple[str, float], ...] = ()  # (resource, share of time some task stalled)


def _edge(seconds: float) -> str:
    return next(e for e in EDGES if e == "+Inf" or seconds <= float(e))


def _stage_buckets(stage: str, phase: Phase, answered: int, always: tuple[str, ...]) -> dict[str, int]:
    """Cumulative per-minute bucket counts of one stage in one phase (``always``: the stages every answer runs)."""
    counts = {e: 0 for e in EDGES}
    listed = [(share, seconds) for name, share, seconds in phase.stages if name == stage]
    slow_runs = 0
    for share, seconds in listed:
        n = round(PER_MINUTE * phase.load * share)
        counts[_edge(seconds)] += n
        slow_runs += n
    if stage in always:
        counts[_edge(FAST_S)] += answered - slow_runs
    running, out = 0, {}
    for e in EDGES:
        running += counts[e]
        out[e] = running
    return out


def traffic(*phases: Phase, job: str = JOB, stages: tuple[str, ...] = STAGES,
            always: tuple[str, ...] = DEFAULT_STAGES, route: str = ROUTES[0], host: bool = False,
            level: str | None = None) -> list[dict]:
    """promtool input series of one scrape job for ``phases``, one after another, at one sample a minute; with
    ``host``, the host's CPU (HOST_CORES) and pressure stalls too; with ``level``, the end-to-end histogram's series
    carry that ``quality_level`` (the quality ladder's rung that answered)."""
    per_minute: dict[str, list[int]] = {}

    def add(series: str, n: int) -> None:
        per_minute.setdefault(series.replace("{", f'{{job="{job}", ', 1), []).append(n)

    route, load = f'route="{route}"', 'qps_bucket="10-50"'
    ok = 'outcome="ok"' + (f', quality_level="{level}"' if level else "")
    for phase in phases:
        for _ in range(phase.minutes):
            offered = round(PER_MINUTE * phase.load)
            failed = round(offered * phase.failed)
            answered, slow = offered - failed, round(offered * phase.slow)
            add(f'{contract.count(contract.REQUEST_DURATION)}{{{route}, {load}, {ok}}}', answered)
            # A fast answer takes its stages' few milliseconds, a slow one just over the objective: the buckets
            # the SLI reads (0.42) and enough others for a P99 to move.
            for le in EDGES:
                within = answered - slow if float(le) < REQUEST_SLOW_S else answered
                add(f'{contract.bucket(contract.REQUEST_DURATION)}{{{route}, {load}, {ok}, le="{le}"}}',
                    within if float(le) >= REQUEST_FAST_S else 0)
            add(f'{contract.REQUESTS}{{{route}, status_class="2xx"}}', answered)
            add(f'{contract.REQUESTS}{{{route}, status_class="5xx"}}', failed)
            for stage in stages:
                buckets = _stage_buckets(stage, phase, answered, always)
                for le, n in buckets.items():
                    add(f'{contract.bucket(contract.STAGE_DURATION)}{{stage="{stage}", {load}, outcome="ok", le="{le}"}}', n)
                add(f'{contract.count(contract.STAGE_DURATION)}{{stage="{stage}", {load}, outcome="ok"}}', buckets["+Inf"])
                add(f'{contract.STAGE_ERRORS}{{stage="{stage}"}}', failed if stage == phase.failing else 0)
            if host:
                busy = phase.process_cores + phase.others_cores
                add(f'{contract.HOST["host_cpu"]}{{instance="{HOST}", mode="user"}}',
                    round(60 * (busy - phase.system_cores)))
                add(f'{contract.HOST["host_cpu"]}{{instance="{HOST}", mode="system"}}', round(60 * phase.system_cores))
                add(f'{contract.HOST["host_cpu"]}{{instance="{HOST}", mode="idle"}}', round(60 * (HOST_CORES - busy)))
                add(f'{contract.HOST["process_cpu"]}{{instance="{HOST}"}}', round(60 * phase.process_cores))
                stalled = dict(phase.stalled)
                for resource in ("cpu", "memory", "io"):
                    add(f'{contract.HOST["pressure"]}{{instance="{HOST}", resource="{resource}", scope="some"}}',
                        round(60 * stalled.get(resource, 0.0)))
    return cumulative(per_minute)


def cumulative(per_minute: dict[str, list[int]]) -> list[dict]:
    """promtool input series from per-minute increments: counters starting at 0, one sample a minute."""
    out = []
    for series, counts in per_minute.items():
        values, running = ["0"], 0
        for n in counts:
            running += n
            values.append(str(running))
        out.append({"series": series, "values": " ".join(values)})
    return out


def merged(*parts: list[dict]) -> list[dict]:
    """Several ``traffic`` parts of one job as one input: a series in more than one part is their sum, sample by
    sample (the stages and the request counter, which carry no ``quality_level``)."""
    sums: dict[str, list[int]] = {}
    for part in parts:
        for s in part:
            values = [int(v) for v in s["values"].split()]
            total = sums.setdefault(s["series"], [0] * len(values))
            sums[s["series"]] = [a + b for a, b in zip(total, values, strict=True)]
    return [{"series": series, "values": " ".join(map(str, values))} for series, values in sums.items()]


LABELS = {
    "fast": {"severity": "page", "burn": "fast", "long_window": "1h", "short_window": "5m"},
    "medium": {"severity": "page", "burn": "medium", "long_window": "6h", "short_window": "30m"},
    "slow": {"severity": "ticket", "burn": "slow", "long_window": "3d", "short_window": "6h"},
}
SUMMARY = {
    ("latency", "fast"): "{job}: Latency SLO error budget burning 14.4x too fast over 1h and 5m; stage: {stage}",
    ("latency", "medium"): "{job}: Latency SLO error budget burning 6x too fast over 6h and 30m; stage: {stage}",
    ("latency", "slow"): "{job}: Latency SLO error budget burning 1x too fast over 3d and 6h; stage: {stage}",
    ("availability", "fast"): "{job}: Availability SLO error budget burning 14.4x too fast over 1h and 5m; stage: {stage}",
    ("availability", "slow"): "{job}: Availability SLO error budget burning 1x too fast over 3d and 6h; stage: {stage}",
    ("quality", "medium"): "{job}: Quality SLO error budget burning 6x too fast over 6h and 30m; verdict: {verdict}",
    ("quality", "slow"): "{job}: Quality SLO error budget burning 1x too fast over 3d and 6h; verdict: {verdict}",
}
OBJECTIVE = {
    "latency": "Objective: 99 % of requests good over 30 days (bad: an answered request slower than 420 ms).",
    "availability": "Objective: 99.9 % of requests good over 30 days (bad: a request answered with a 5xx status).",
    "quality": "Objective: 95 % of scored answers good over 30 days (bad: an answer judged no_good_passage, fell_back "
               "or unsupported; unscored ones count on neither side).",
}
GONE = {"fast": " At this rate the whole budget is gone in 50 hours.",
        "medium": " At this rate the whole budget is gone in 5 days.",
        "slow": " At this rate the whole budget is gone in 30 days."}
OVER = "{stage} alone took longer than 420 ms in {rate} requests/s over {window}, more than any other stage"
SPREAD = "no stage alone took longer than 420 ms over {window}; {stage} has the highest P99 ({p99})"
FAILED = "{stage} failed in {rate} requests/s over {window}, more than any other stage"
ALERT = {"latency": "RagheatLatencyBudgetBurn", "availability": "RagheatAvailabilityBudgetBurn",
         "quality": "RagheatQualityBudgetBurn"}
NO_CAUSE = ("none", "no cause: the P99 over 5m did not grow beyond noise against the 1h before (ragheat explain "
                    "has the full evidence)")
CAUSED = "{ms} ms of stage P99 growth over 5m against the 1h before, most in {stage} (P99 {before} -> {now} ms)"


def fires(slo_name: str, minute: int, stage: str, job: str = JOB, cause: tuple[str, str] | None = None,
          **evidence: str) -> dict:
    """promtool's expectation at ``minute``: the SLO's alerts of the burns given (``fast="evidence"``), each with
    the rule's labels (``job`` among them) and annotations naming ``stage`` (and, for latency, ``cause``: the cause and
    its evidence, NO_CAUSE by default); no keyword means the SLO's alerts stay quiet."""
    return together(slo_name, minute, {job: (stage, evidence)}, {job: cause or NO_CAUSE})


def together(slo_name: str, minute: int, by_job: dict[str, tuple[str, dict[str, str]]],
             causes: dict[str, tuple[str, str]] | None = None) -> dict:
    """As ``fires``, for several jobs at once: job -> (the stage named, {burn: evidence}), and job -> (the cause named,
    its evidence); promtool compares the whole list of the SLO's alerts, so a job left out must have none."""
    def cause(job: str) -> dict:
        name, text = (causes or {}).get(job, NO_CAUSE)
        return {"cause": name, "cause_evidence": text} if slo_name == "latency" else {}

    alerts = [{"exp_labels": {**LABELS[burn], "slo": slo_name, "job": job},
               "exp_annotations": {"summary": SUMMARY[slo_name, burn].format(stage=stage, job=job),
                                   "description": OBJECTIVE[slo_name] + GONE[burn],
                                   "stage": stage, "stage_evidence": text, **cause(job)}}
              for job, (stage, evidence) in by_job.items() for burn, text in evidence.items()]
    return {"eval_time": f"{minute}m", "alertname": ALERT[slo_name], "exp_alerts": alerts}


def quiet(slo_name: str, *minutes: int) -> list[dict]:
    return [fires(slo_name, minute, "") for minute in minutes]


H = HEALTHY_HISTORY
SLOW_FUSE = ("fuse", 1.0, 0.5)  # every answer spends 500 ms in fusion
# A stage P99 interpolates in its bucket: 5 ms in (0, 7.5 ms] is 7.4 ms, 500 ms in (420, 500 ms] is 499 ms. Fuse alone
# slowed (the other stages did not move): its whole growth is its own, 499.2 - 7.4 = 492 ms.
FUSE_ALONE = ("stage", CAUSED.format(ms=492, stage="fuse", before=7, now=499))
SCENARIOS = {
    # All answers slow in fuse: the 1 h ratio passes 14.4 % after 8.6 minutes, so it pages between minute 7
    # and 10; the 3 d ticket (its window holds only the short synthetic history) fires too, and is inhibited
    # by the page in Alertmanager. The 6 h page needs 21.6 minutes. Evidence: fuse's over-420-ms executions
    # per second over each short window (7 x 600 / 6 h = 0.194/s, 10 x 600 / 6 h = 0.278/s, 24 x 600 / 30 m = 8/s).
    "fast latency burn pages within 10 minutes, naming the stage": (
        traffic(Phase(H), Phase(25, slow=1.0, stages=(SLOW_FUSE,))),
        [*quiet("latency", H - 1),
         fires("latency", H + 7, "fuse", cause=FUSE_ALONE,
               slow=OVER.format(stage="fuse", rate="0.194", window="6h")),
         fires("latency", H + 10, "fuse", cause=FUSE_ALONE,
               fast=OVER.format(stage="fuse", rate="10", window="5m"),
               slow=OVER.format(stage="fuse", rate="0.278", window="6h")),
         # 24 minutes in, the baseline (the median 5 minutes of the hour before) is still the healthy one.
         fires("latency", H + 24, "fuse", cause=FUSE_ALONE,
               fast=OVER.format(stage="fuse", rate="10", window="5m"),
               medium=OVER.format(stage="fuse", rate="8", window="30m"),
               slow=OVER.format(stage="fuse", rate="0.667", window="6h"))]),
    # The failure this rule exists for: an LLM path taken by 5 % of requests spends 4 s decoding (the highest P99
    # by far) while every request spends 500 ms in fuse. Fuse made 10 requests/s bad, decode 0.5/s: fuse is named.
    # The cause agrees: decode ran only in the fault's minutes, so the hour before holds no other decode P99 to
    # compare with than the fault's own (it did not grow), and fuse's 492 ms are the growth.
    "a slow stage in every request is named over a slower one in a few": (
        traffic(Phase(H), Phase(12, slow=1.0, stages=(SLOW_FUSE, ("generate_decode", 0.05, 4.0)))),
        [*quiet("latency", H - 1),
         fires("latency", H + 10, "fuse", cause=FUSE_ALONE,
               fast=OVER.format(stage="fuse", rate="10", window="5m"),
               slow=OVER.format(stage="fuse", rate="0.278", window="6h"))]),
    # Time spread over stages: embed 300 ms + retrieve_bm25 150 ms makes every answer 450 ms, yet no stage alone
    # crosses 420 ms; the highest P99 (embed) is named, and the evidence says which rule named it. Neither stage
    # stands out (ratios 47 and 27, twice their median is 74) and the host is not measured: each is its own cause,
    # 341 + 191 ms.
    "time spread over stages names the highest P99": (
        traffic(Phase(H), Phase(12, slow=1.0, stages=(("embed", 1.0, 0.3), ("retrieve_bm25", 1.0, 0.15)))),
        [fires("latency", H + 10, "embed", cause=("stage", CAUSED.format(ms=532, stage="embed", before=7, now=348)),
               fast=SPREAD.format(stage="embed", p99="348.5ms", window="5m"),
               slow=SPREAD.format(stage="embed", p99="296ms", window="6h"))]),
    # 2 % slow in retrieve_dense = 2x burn: the ticket opens once the 6 h and 3 d ratios pass 1 %; no page ever.
    # 12 slow executions a minute since minute 60: 90 x 12 / 6 h = 0.05/s at minute 150, 0.1 at 240, 0.133 at 300.
    # The fault is older than the hour the cause compares with: no cause (the default expectation).
    "slow latency burn opens a ticket and never pages": (
        traffic(Phase(60), Phase(240, slow=0.02, stages=(("retrieve_dense", 0.02, 0.5),))),
        [*quiet("latency", 90),
         fires("latency", 150, "retrieve_dense",
               slow=OVER.format(stage="retrieve_dense", rate="0.05", window="6h")),
         fires("latency", 240, "retrieve_dense",
               slow=OVER.format(stage="retrieve_dense", rate="0.1", window="6h")),
         fires("latency", 300, "retrieve_dense",
               slow=OVER.format(stage="retrieve_dense", rate="0.133", window="6h"))]),
    # Half the budget's rate (0.5 % slow, 0.05 % failed): quiet on both SLOs all along.
    "healthy service stays quiet": (
        traffic(Phase(400, slow=0.005, failed=0.0005, failing="embed", stages=(("embed", 0.005, 0.5),))),
        [*quiet("latency", 60, 200, 399), *quiet("availability", 60, 200, 399)]),
    # Every answer slow for 3 minutes, shorter than the 5 m short window: the 1 h ratio peaks at 5 %.
    "spike shorter than the short window does not page": (
        traffic(Phase(H), Phase(3, slow=1.0, stages=(("embed", 1.0, 0.5),)), Phase(30)),
        quiet("latency", H + 2, H + 3, H + 5, H + 10, H + 30)),
    # 10 % of requests fail in retrieve_bm25 (budget 0.1 %): the fast page fires after ~9 minutes and names
    # the stage (60 failures a minute: 1/s over 5 m, 12 x 60 / 6 h = 0.0333/s); answers stay fast, latency is quiet.
    "availability fast burn pages, naming the failing stage": (
        traffic(Phase(H), Phase(15, failed=0.1, failing="retrieve_bm25")),
        [*quiet("availability", H + 2),
         fires("availability", H + 12, "retrieve_bm25",
               fast=FAILED.format(stage="retrieve_bm25", rate="1", window="5m"),
               slow=FAILED.format(stage="retrieve_bm25", rate="0.0333", window="6h")),
         *quiet("latency", H + 12)]),
}


# Two services in one Prometheus, told apart by their scrape job: ragheat itself and a library-only service whose
# stages carry the names a foreign service uses. The evidence numbers are those of the scenarios above: every
# answer slow in one stage gives 10/s over 5 m and 10 x 600 / 6 h = 0.278/s at minute 10.
LIBRARY = dict(job=LIBRARY_JOB, stages=LIBRARY_STAGES, always=LIBRARY_STAGES, route="/ask")
SERVICES = {
    # Only the library service is slow (500 ms in its tool call): only its page and ticket fire, naming its job.
    "two services: only the slow one's alert fires, naming its job": (
        traffic(Phase(H), Phase(12)) + traffic(Phase(H), Phase(12, slow=1.0, stages=(("tool", 1.0, 0.5),)), **LIBRARY),
        [*quiet("latency", H - 1),
         fires("latency", H + 10, "tool", job=LIBRARY_JOB,
               cause=("stage", CAUSED.format(ms=492, stage="tool", before=7, now=499)),
               fast=OVER.format(stage="tool", rate="10", window="5m"),
               slow=OVER.format(stage="tool", rate="0.278", window="6h")),
         *quiet("availability", H + 10)]),
    # Both slow, each in its own stage, ragheat's more often (10/s in fuse against 5/s in retrieve): each alert
    # names its own job's stage, never the worse one of the other job. Half the library's answers slow burns
    # its 1 h budget past 14.4x after 17.3 minutes: at minute 20, 6000 of 36000 (its 6 h window: 20 x 300 / 6 h).
    "two slow services: each alert names its own stage": (
        traffic(Phase(H), Phase(22, slow=1.0, stages=(SLOW_FUSE,)))
        + traffic(Phase(H), Phase(22, slow=0.5, stages=(("retrieve", 0.5, 0.5),)), **LIBRARY),
        [together("latency", H + 20, {
            JOB: ("fuse", {"fast": OVER.format(stage="fuse", rate="10", window="5m"),
                           "slow": OVER.format(stage="fuse", rate="0.556", window="6h")}),
            LIBRARY_JOB: ("retrieve", {"fast": OVER.format(stage="retrieve", rate="5", window="5m"),
                                       "slow": OVER.format(stage="retrieve", rate="0.278", window="6h")})},
            {JOB: FUSE_ALONE, LIBRARY_JOB: ("stage", CAUSED.format(ms=491, stage="retrieve", before=7, now=498))})]),
}


# Causes of a slower tail (dashboards.why) on a measured host: the page names the top cause, and the recorded scores
# rank every cause of the closed set, in milliseconds of stage P99 growth. Every answer slow in six stages together
# (embed 300 ms, five others 100 ms) grows their P99s by 341 + 5 x 191 = 1294 ms; none stands out (embed's ratio 47
# is under twice the median 27), so the machine-wide sources share it by the cores each took beyond the baseline.
HYBRID_RERANKED = ("embed", "retrieve_dense", "retrieve_bm25", "fuse", "rerank", "generate")  # six stages
TOGETHER = (("embed", 1.0, 0.3), *((stage, 1.0, 0.1) for stage in HYBRID_RERANKED if stage != "embed"))
CAUSES = ("overload", "cpu_neighbour", "cpu_in_process", "memory", "io", "language_model", "graph_store", "stage")


def scores(minute: int, **ms: int) -> dict:
    """promtool's expectation of every cause's score (rounded milliseconds; zero unless given) at ``minute``."""
    return {"expr": f'round({"ragheat:why_cause:score5m"}{{job="{JOB}"}})', "eval_time": f"{minute}m",
            "exp_samples": [{"labels": f'{{cause="{cause}", job="{JOB}"}}', "value": ms.get(cause, 0)}
                            for cause in CAUSES]}


def fast_page(minute: int, stage: str, cause: tuple[str, str]) -> dict:
    """The fast page and the ticket at ``minute``, every answer slow in ``stage`` (alone over 420 ms) or spread."""
    return fires("latency", minute, stage, cause=cause,
                 fast=OVER.format(stage=stage, rate="10", window="5m"),
                 slow=OVER.format(stage=stage, rate="0.278", window="6h"))


SPREAD_PAGE = dict(fast=SPREAD.format(stage="embed", p99="348.5ms", window="5m"),
                   slow=SPREAD.format(stage="embed", p99="296ms", window="6h"))
MOST_IN_EMBED = CAUSED.format(ms="{ms}", stage="embed", before=7, now=348)
CAUSE_SCENARIOS = {
    # A neighbour takes 2 more cores and the host's tasks stall on I/O 30 % of the time (2.4 of its 8 cores): I/O
    # gets 2.4 / 4.4 of the 1294 ms, the neighbour 2 / 4.4. Healthy, every score is zero.
    "I/O stalls and a neighbour share a slowdown, I/O first": (
        traffic(Phase(H), Phase(12, slow=1.0, stages=TOGETHER, others_cores=2.5, stalled=(("io", 0.3),)), host=True),
        [*quiet("latency", H - 1),
         fires("latency", H + 10, "embed", cause=("io", MOST_IN_EMBED.format(ms=706)
                                                  + "; tasks stalled on I/O 30% against 0% of the time"), **SPREAD_PAGE)],
        [scores(H - 1), scores(H + 10, io=706, cpu_neighbour=588)]),
    # Memory stalls 20 % of the time (1.6 of the 8 cores) while the rest of the host burns 2 more cores, all of them
    # the kernel's (reclaim): memory's, not a neighbour's, so memory takes the whole 1294 ms.
    "memory stalls and the kernel reclaiming: memory, not a neighbour": (
        traffic(Phase(H), Phase(12, slow=1.0, stages=TOGETHER, others_cores=2.5, system_cores=2.0,
                                stalled=(("memory", 0.2),)), host=True),
        [fires("latency", H + 10, "embed", cause=("memory", MOST_IN_EMBED.format(ms=1294)
                                                  + "; tasks stalled on memory 20% against 0% of the time"),
               **SPREAD_PAGE)],
        [scores(H + 10, memory=1294)]),
    # A host already busy (the service 1 core, the rest 7 of 8) cannot get busier: the neighbour shows as the host's
    # tasks waiting for a CPU 30 % more of the time, at the same load and the service's same CPU.
    "a neighbour on a host already busy: tasks wait longer for a CPU": (
        traffic(Phase(H, others_cores=7.0), Phase(12, slow=1.0, stages=TOGETHER, others_cores=7.0,
                                                  stalled=(("cpu", 0.3),)), host=True),
        [fires("latency", H + 10, "embed", cause=("cpu_neighbour", MOST_IN_EMBED.format(ms=1294)
                                                  + "; other processes on the host busy 7.00 against 7.00 cores"),
               **SPREAD_PAGE)],
        [scores(H + 10, cpu_neighbour=1294)]),
    # The service's process burns 2 more cores at the same load: all of it is work no request explains.
    "the service's own CPU at the same load": (
        traffic(Phase(H), Phase(12, slow=1.0, stages=TOGETHER, process_cores=3.0), host=True),
        [fires("latency", H + 10, "embed", cause=("cpu_in_process", MOST_IN_EMBED.format(ms=1294)
               + "; the service's process 3.00 against 1.00 cores at 10.0 against 10.0 req/s offered"), **SPREAD_PAGE)],
        [scores(H + 10, cpu_in_process=1294)]),
    # Twice the load, at the baseline's CPU per request, waits 300 ms in the queue: overload, from the queue stage.
    "more load waits in the queue": (
        traffic(Phase(H), Phase(12, slow=1.0, load=2.0, process_cores=2.0, stages=(("queue", 1.0, 0.3),)),
                always=(*DEFAULT_STAGES, "queue"), host=True),
        [fires("latency", H + 10, "queue",
               cause=("overload", CAUSED.format(ms=341, stage="queue", before=7, now=348)
                      + "; 20.0 against 10.0 req/s offered"),
               fast=SPREAD.format(stage="queue", p99="348.5ms", window="5m"),
               slow=SPREAD.format(stage="queue", p99="322.2ms", window="6h"))],
        [scores(H + 10, overload=341)]),
}


# The quality SLO (dashboards.quality): answers by verdict, the best similarity's histogram and the calibration gauge
# of one job, as the service exports them. Every minute 600 answers are scored (10/s) and 60 are not (no dense search:
# on neither side of the SLI); an answer without a good passage has a best similarity of 0.3 (its bucket (0.25, 0.3]),
# every other one 0.6 ((0.55, 0.6]). Budget 5 %: the medium page needs 30 % bad over 6 h and 30 m, the ticket 5 % over
# 3 d and 6 h, the fast page 72 % (so half the answers bad never pages fast).
SCORED, UNSCORED = 600, 60
SIMILARITY = {"no_good_passage": 0.3, "good": 0.6}
CALIBRATED = {contract.THRESHOLD: 0.42, contract.P10: 0.51, contract.MEDIAN: 0.64}


@dataclass(frozen=True)
class Judged:
    """``minutes`` of answers, ``bad`` listing (verdict, share of the scored answers); the rest are good."""

    minutes: int
    bad: tuple[tuple[str, float], ...] = ()


def answers(*phases: Judged, job: str = JOB, created: tuple[str, ...] = contract.VERDICTS,
            scored: int = SCORED) -> list[dict]:
    """promtool input series of one job's judged answers, one sample a minute; ``created``: the verdicts whose series
    exist (the service creates every one at zero; another may create a bad verdict's with its first answer)."""
    edges = [floatToGoString(e) for e in UNIT_SCORES] + ["+Inf"]
    similarity = f'{contract.bucket(contract.QUALITY_SCORE)}{{job="{job}", signal="{contract.BEST_SIMILARITY}"'
    per_minute: dict[str, list[int]] = {}
    for phase in phases:
        for _ in range(phase.minutes):
            counts = {verdict: round(scored * share) for verdict, share in phase.bad}
            counts["good"] = scored - sum(counts.values())
            counts[contract.UNSCORED] = UNSCORED
            for verdict in created:
                per_minute.setdefault(f'{contract.ANSWER_QUALITY}{{job="{job}", verdict="{verdict}"}}', []).append(
                    counts.get(verdict, 0))
            low = counts.get("no_good_passage", 0)
            for le in edges:
                within = (low if float(le) >= SIMILARITY["no_good_passage"] else 0) + (
                    scored - low if float(le) >= SIMILARITY["good"] else 0)
                per_minute.setdefault(f'{similarity}, le="{le}"}}', []).append(within)
    out = cumulative(per_minute)
    minutes = sum(p.minutes for p in phases)
    out += [{"series": f'{contract.CALIBRATION}{{job="{job}", signal="{contract.BEST_SIMILARITY}", point="{point}"}}',
             "values": f"{value}+0x{minutes}"} for point, value in CALIBRATED.items()]
    return out


VERDICT = "{verdict}: {rate} answers/s of {scored} scored over {window}, more than any other bad verdict"
DRIFT = ("median best_similarity {median} over {window} against 0.64 on the training questions (calibration p50); "
         "answers under 0.42 have no good passage")


def quality_fires(minute: int, verdict: str, **evidence: tuple[str, str]) -> dict:
    """promtool's expectation at ``minute``: the quality alerts of the burns given (``slow=(evidence, drift)``),
    each naming ``verdict``; no keyword means they stay quiet."""
    return {"eval_time": f"{minute}m", "alertname": ALERT["quality"], "exp_alerts": [
        {"exp_labels": {**LABELS[burn], "slo": "quality", "job": JOB},
         "exp_annotations": {"summary": SUMMARY["quality", burn].format(job=JOB, verdict=verdict),
                             "description": OBJECTIVE["quality"] + GONE[burn], "verdict": verdict,
                             "verdict_evidence": text, "drift": drift}}
        for burn, (text, drift) in evidence.items()]}


HEALTHY_QUALITY = (("no_good_passage", 0.02),)  # the calibration's flag rate: on traffic like its training questions
HALF_WITHOUT = (("no_good_passage", 0.48), ("fell_back", 0.02))  # half the answers bad, nearly all without a passage
QUALITY_SCENARIOS = {
    # 12 answers a minute without a good passage, then 288 (and 12 fell back) from minute H. The ticket: the 3 d ratio
    # (all of the history) passes 5 % after 24.7 minutes ((4440 + 300 f) / (600 (370 + f))), the 6 h one after 22.5;
    # the medium page: the 6 h ratio passes 30 % after 210 minutes ((4320 + 288 f) / 216000), the 30 m one long before.
    # Evidence over 6 h at minute H + f: (12 (360 - f) + 288 f) / 21600 answers/s without a good passage (0.583 at
    # f = 30, 2.76 at 200, 3.01 at 220); over 30 m: 288 / 60 = 4.8/s. The scored rate is 10/s throughout.
    # The median similarity interpolates in (0.55, 0.6]: 0.55 + 0.05 (half - low) / (all - low), with low the answers
    # at 0.3 in the window: over 6 h 0.573 (f = 30), 0.565 (200), 0.564 (220); over 30 m 0.552.
    "half the answers without a good passage: a ticket, then the medium page, naming the verdict": (
        answers(Judged(H, HEALTHY_QUALITY), Judged(225, HALF_WITHOUT)),
        [*(quality_fires(minute, "") for minute in (H - 1, H + 24)),
         quality_fires(H + 30, "no_good_passage",
                       slow=(VERDICT.format(verdict="no_good_passage", rate="0.583", scored="10", window="6h"),
                             DRIFT.format(median="0.57", window="6h"))),
         quality_fires(H + 200, "no_good_passage",
                       slow=(VERDICT.format(verdict="no_good_passage", rate="2.76", scored="10", window="6h"),
                             DRIFT.format(median="0.57", window="6h"))),
         quality_fires(H + 220, "no_good_passage",
                       medium=(VERDICT.format(verdict="no_good_passage", rate="4.8", scored="10", window="30m"),
                               DRIFT.format(median="0.55", window="30m")),
                       slow=(VERDICT.format(verdict="no_good_passage", rate="3.01", scored="10", window="6h"),
                             DRIFT.format(median="0.56", window="6h")))],
        []),
    # 2 % bad, the share the calibration flags on its own training questions: under the 5 % budget, quiet throughout.
    "2 % bad stays quiet": (
        answers(Judged(400, HEALTHY_QUALITY)),
        [quality_fires(minute, "") for minute in (60, 200, 399)],
        []),
    # A new service's first answers, three a minute and every one bad: while the short windows hold fewer than
    # quality.MIN_SCORED (15 at minute 5), nothing fires; at minute 8 the 30 m and 6 h windows hold 24, and the medium
    # page and the ticket do (the 5 m window still holds 15: no fast page).
    "a new service's first answers page nobody until there are enough": (
        answers(Judged(10, (("no_good_passage", 1.0),)), scored=3),
        [quality_fires(5, "")],
        [{"expr": f'ALERTS{{alertname="{ALERT["quality"]}", alertstate="firing"}}', "eval_time": "5m",
          "exp_samples": []},
         {"expr": f'count by (burn) (ALERTS{{alertname="{ALERT["quality"]}", alertstate="firing"}})',
          "eval_time": "8m", "exp_samples": [{"labels": '{burn="medium"}', "value": 1},
                                             {"labels": '{burn="slow"}', "value": 1}]}]),
    # A service whose bad verdicts' series do not exist yet: its bad share reads 0 per job, not missing.
    "no bad verdict yet reads 0, not missing": (
        answers(Judged(40), created=("good", contract.UNSCORED)),
        [quality_fires(30, "")],
        [{"expr": f'{slo.sli_error_record(w)}{{slo="quality"}}', "eval_time": "30m",
          "exp_samples": [{"labels": f'{slo.sli_error_record(w)}{{job="{JOB}", slo="quality"}}', "value": 0}]}
         for w in ("5m", "6h")]),
}


# Answers at two rungs of the quality ladder (the load controller serves half the traffic at a cheaper rung): every
# minute 300 answers at full, 12 of them slower than 420 ms, and 300 at bm25_only, all fast. Summed over
# quality_level, 12 of 600 are bad: 2 % (full alone 4 %, bm25_only 0), a 2x burn that opens the ticket (on the short
# synthetic history) and pages nobody; 10 answers/s; the P99 in (420, 500] ms at 0.42 + 0.08 x (594 - 588) / 12 =
# 460 ms (full's alone would be 480 ms). Any rule that kept the level would record two series for the job.
TWO_LEVELS = merged(traffic(Phase(40, slow=0.04, load=0.5), level="full"),
                    traffic(Phase(40, load=0.5), level="bm25_only"))
SUMMED_OVER_LEVELS = [
    *({"expr": f'round(1000 * {slo.sli_error_record(w)}{{slo="latency"}})', "eval_time": "30m",
       "exp_samples": [{"labels": f'{{job="{JOB}", slo="latency"}}', "value": 20}]} for w in ("5m", "1h", "6h")),
    {"expr": "round(ragheat:why_answered_per_s:5m)", "eval_time": "30m",
     "exp_samples": [{"labels": f'{{job="{JOB}"}}', "value": 10}]},
    {"expr": "round(ragheat:why_p99_ms:5m)", "eval_time": "30m",
     "exp_samples": [{"labels": f'{{job="{JOB}"}}', "value": 460}]},
    {"expr": f'count by ({slo.KEPT}, burn) (ALERTS{{alertname="{ALERT["latency"]}", alertstate="firing"}})',
     "eval_time": "30m", "exp_samples": [{"labels": f'{{burn="slow", job="{JOB}"}}', "value": 1}]},
]


def test_the_latency_rules_sum_over_the_quality_level(tmp_path):
    """The end-to-end histogram's series carry the rung that answered (``quality_level``): the latency SLI, the
    answered rate and the P99 the causes read are the job's, one series summed over every rung, and the ticket fires
    once for the job."""
    assert len({s["series"] for s in TWO_LEVELS}) == len(TWO_LEVELS)
    assert sum('quality_level="' in s["series"] for s in TWO_LEVELS) == 2 * (1 + len(EDGES))
    result = promtool_test(tmp_path, "two quality levels", TWO_LEVELS, [], SUMMED_OVER_LEVELS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_that_kept_the_quality_level_apart_would_fail(tmp_path, monkeypatch):
    """The test above can fail: the same SLI grouping by ``quality_level`` records one bad share per rung (4 % and 0)
    instead of the job's 2 %."""
    import sys

    kit = sys.modules[promtool_test.__module__]  # the module whose RULES promtool_test copies
    rules = tmp_path / "per-level.yml"
    text = kit.RULES.read_text()
    # The latency SLI's lines only (the one bucket they read): the causes' records stay as they are.
    rules.write_text("\n".join(line.replace("sum by (job) (", "sum by (job, quality_level) (")
                               if f'le="{slo.SLO_LE}"' in line and contract.REQUEST_DURATION in line else line
                               for line in text.split("\n")))
    assert rules.read_text().count("sum by (job, quality_level) (") == 2 * len(slo.SLI_WINDOWS_S)
    monkeypatch.setattr(kit, "RULES", rules)
    (tmp_path / "run").mkdir()
    result = promtool_test(tmp_path / "run", "two quality levels", TWO_LEVELS, [], SUMMED_OVER_LEVELS[:1])
    assert result.returncode != 0
    assert "quality_level" in result.stdout + result.stderr


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_promtool_unit_tests(scenario, tmp_path):
    series, alert_tests = SCENARIOS[scenario]
    result = promtool_test(tmp_path, scenario, series, alert_tests)
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("scenario", list(SERVICES))
def test_promtool_unit_tests_of_two_services(scenario, tmp_path):
    series, alert_tests = SERVICES[scenario]
    result = promtool_test(tmp_path, scenario, series, alert_tests)
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("scenario", list(CAUSE_SCENARIOS))
def test_promtool_unit_tests_of_causes(scenario, tmp_path):
    series, alert_tests, expr_tests = CAUSE_SCENARIOS[scenario]
    result = promtool_test(tmp_path, scenario, series, alert_tests, expr_tests)
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("scenario", list(QUALITY_SCENARIOS))
def test_promtool_unit_tests_of_the_quality_slo(scenario, tmp_path):
    series, alert_tests, expr_tests = QUALITY_SCENARIOS[scenario]
    result = promtool_test(tmp_path, scenario, series, alert_tests, expr_tests)
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("wrong", ["silence during the fast burn", "the slowest stage by P99",
                                   "the healthy service pages too", "the other service's stage",
                                   "the neighbour ranked over the I/O stalls", "quality quiet at half bad",
                                   "quality naming the rarer verdict"])
def test_promtool_unit_tests_can_fail(tmp_path, wrong):
    """Wrong expectations must fail: the unit tests above are not vacuous, the LLM scenario really has a stage
    (generate_decode) with a higher P99 than the one named, the two services' alerts really are apart, the
    recorded scores really rank the causes, and the quality alert really fires and names the commoner verdict."""
    expr_tests = ()
    if wrong == "silence during the fast burn":
        series, _ = SCENARIOS["fast latency burn pages within 10 minutes, naming the stage"]
        tests, needle = quiet("latency", H + 15), "burn=fast"
    elif wrong == "the slowest stage by P99":
        series, _ = SCENARIOS["a slow stage in every request is named over a slower one in a few"]
        tests = [fires("latency", H + 10, "generate_decode",
                       fast=OVER.format(stage="generate_decode", rate="0.5", window="5m"),
                       slow=OVER.format(stage="generate_decode", rate="0.0139", window="6h"))]
        needle = "stage=fuse"
    elif wrong == "the healthy service pages too":
        series, _ = SERVICES["two services: only the slow one's alert fires, naming its job"]
        both = {job: ("tool", {"fast": OVER.format(stage="tool", rate="10", window="5m"),
                               "slow": OVER.format(stage="tool", rate="0.278", window="6h")})
                for job in (JOB, LIBRARY_JOB)}
        tests, needle = [together("latency", H + 10, both)], f"job={JOB}"
    elif wrong == "the other service's stage":
        series, _ = SERVICES["two slow services: each alert names its own stage"]
        tests = [together("latency", H + 20, {
            JOB: ("fuse", {"fast": OVER.format(stage="fuse", rate="10", window="5m"),
                           "slow": OVER.format(stage="fuse", rate="0.556", window="6h")}),
            LIBRARY_JOB: ("fuse", {"fast": OVER.format(stage="fuse", rate="10", window="5m"),
                                   "slow": OVER.format(stage="fuse", rate="0.556", window="6h")})})]
        needle = "stage=retrieve"
    elif wrong == "the neighbour ranked over the I/O stalls":
        series, tests, _ = CAUSE_SCENARIOS["I/O stalls and a neighbour share a slowdown, I/O first"]
        expr_tests, needle = [scores(H + 10, io=588, cpu_neighbour=706)], "cause=io"
    elif wrong == "quality quiet at half bad":
        series, _, _ = QUALITY_SCENARIOS["half the answers without a good passage: a ticket, then the medium page, "
                                         "naming the verdict"]
        tests, needle = [quality_fires(H + 220, "")], "burn=medium"
    elif wrong == "quality naming the rarer verdict":
        series, _, _ = QUALITY_SCENARIOS["half the answers without a good passage: a ticket, then the medium page, "
                                         "naming the verdict"]
        tests = [quality_fires(H + 30, "fell_back",
                               slow=(VERDICT.format(verdict="fell_back", rate="0.0167", scored="10", window="6h"),
                                     DRIFT.format(median="0.57", window="6h")))]
        needle = "verdict=no_good_passage"
    result = promtool_test(tmp_path, wrong, series, tests, expr_tests)
    assert result.returncode != 0
    assert needle in (result.stdout + result.stderr).replace('"', ""), result.stdout + result.stderr
