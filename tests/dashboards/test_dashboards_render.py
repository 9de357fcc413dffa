"""The generator: committed files never drift from it, names come from the metrics contract, Grafana JSON and
provisioning have what Grafana needs (the command line: tests/ragheat/test_dashboards_cli.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dashboards import contract, grafana, quality, render, slo
from dashboards.boards import GRAPH_STAGES, OWN_HEATMAP_STAGES, SIGNAL_HEATMAPS, all_boards
from dashboards.snapshot import heatmap_from_result
from dashboards.spec import JOB, NATIVE, ON_JOB, SCRAPED, SOURCE, Choice, Variable, expand, regex_literal
from dashboards.verify import family_present, selected
from telemetry.metrics import EXPECTED_METRICS, METRICS, QUALITY_POINTS, PrometheusMetrics

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
METRIC_TOKEN = re.compile(r"(?<![\w:])((?:ragheat_|ragheat:|vllm:|stage:|slo:|milvus_)[\w:]+|process_resident_memory_bytes)")
SUFFIXES = ("", "_bucket", "_count", "_sum")


def all_exprs(profile: slo.Profile) -> list[str]:
    exprs = [q.expr for b in all_boards(profile) for p in b.panels for q in p.queries]
    exprs += [v.metric for b in all_boards(profile) for v in b.variables if isinstance(v, Variable)]
    rules = slo.prometheus_rules(profile)
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    exprs += [a for g in rules["groups"] for r in g["rules"] for a in r.get("annotations", {}).values()]
    return exprs


def test_committed_files_match_the_generator():
    expected = render.rendered_files(slo.PRODUCTION)
    drifted = [str(path) for path, text in expected.items()
               if not (DASHBOARDS / path).is_file() or (DASHBOARDS / path).read_text(encoding="utf-8") != text]
    assert not drifted, (f"committed files differ from the generator: {drifted}; "
                         "run `ragheat dashboards render dashboards` and commit the result")
    rendered_dirs = {path.parts[0] for path in expected}
    stale = [str(p.relative_to(DASHBOARDS)) for d in rendered_dirs for p in (DASHBOARDS / d).rglob("*")
             if p.is_file() and p.relative_to(DASHBOARDS) not in expected]
    assert not stale, f"files the generator no longer writes: {stale}"


@pytest.mark.parametrize("profile", list(slo.PROFILES))
def test_every_metric_name_is_from_the_contract_or_a_recording_rule(profile):
    families = [*contract.SERVICE.values(), *contract.GENERATION.values(), *contract.QUALITY.values(),
                *contract.KERNEL.values(), *contract.HOST.values(), *contract.VLLM.values(),
                *contract.VLLM_NATIVE.values(), *contract.MILVUS.values()]
    known = {f + s for f in families for s in SUFFIXES}
    known |= {r["record"] for g in slo.prometheus_rules(slo.PROFILES[profile])["groups"] for r in g["rules"]
              if "record" in r}
    used = {token for expr in all_exprs(slo.PROFILES[profile]) for token in METRIC_TOKEN.findall(expr)}
    assert used and used <= known, sorted(used - known)
    # The service's own names really are what a scrape exposes.
    assert {contract.STAGE_DURATION, contract.REQUEST_DURATION, contract.REQUESTS} <= set(EXPECTED_METRICS)


def test_boards_read_every_kernel_vllm_and_milvus_family_they_promise():
    sources = {b.slug: {s for p in b.panels for q in p.queries for s in q.sources} for b in all_boards(slo.PRODUCTION)}
    assert set(contract.MILVUS.values()) == sources["milvus"]
    assert {contract.KERNEL[k] for k in ("runqueue", "offcpu", "syscall")} <= sources["kernel"]
    assert set(contract.VLLM_NATIVE.values()) <= sources["vllm"]
    assert {contract.GENERATION[k] for k in ("ttft", "inter_token")} <= sources["vllm"]
    assert {contract.VLLM[k] for k in ("kv_usage", "preemptions")} <= sources["vllm"]


def test_slo_bucket_label_is_what_the_service_exposes():
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, qps_labels=("0-1",))
    metrics.request_duration.labels(route="/v1/query", qps_bucket="0-1", outcome="ok",
                                    quality_level=contract.LEVELS[0]).observe(0.1)
    les = {s.labels["le"] for family in text_string_to_metric_families(generate_latest(registry).decode())
           for s in family.samples if s.name == contract.bucket(contract.REQUEST_DURATION)}
    assert slo.SLO_LE in les
    assert f'le="{slo.SLO_LE}"' in render.rendered_files(slo.PRODUCTION)[render.RULES_FILE]


@pytest.mark.parametrize("board", all_boards(slo.PRODUCTION), ids=lambda b: b.slug)
def test_dashboard_json_is_sorted_and_complete(board):
    text = grafana.dashboard_json(board)
    data = json.loads(text)
    assert text == json.dumps(data, sort_keys=True, indent=2) + "\n"
    assert (data["uid"], data["title"]) == (board.uid, board.title)
    panels = data["panels"]
    assert [p["title"] for p in panels] == [p.title for p in board.panels]
    for spec, panel in zip(board.panels, panels):
        assert panel["datasource"]["uid"] == grafana.PROMETHEUS_UID
        assert [t["expr"] for t in panel["targets"]] == [q.expr for q in spec.queries]
        assert all(t["exemplar"] == spec.exemplars for t in panel["targets"])
        if spec.kind == "heatmap":
            assert panel["type"] == "heatmap" and panel["options"]["calculate"] is False
            for query, target in zip(spec.queries, panel["targets"]):
                if query.histograms == NATIVE:  # a native histogram: Grafana draws its own buckets
                    assert target["format"] == "time_series" and target["legendFormat"] == ""
                else:  # classic buckets: one series per le
                    assert target["format"] == "heatmap" and target["legendFormat"] == "{{le}}"
        if spec.repeat:
            assert panel["repeat"] == spec.repeat
            assert spec.repeat in {t["name"] for t in data["templating"]["list"]}
        right = panel["gridPos"]["x"] + panel["gridPos"]["w"]
        assert right <= 24, (spec.title, panel["gridPos"])
    for variable in data["templating"]["list"]:
        if variable["type"] == "custom":  # the histogram source: fixed options, scraped first
            assert variable["name"] == SOURCE and variable["query"] == "scraped : 0,native : 1"
            assert [o["text"] for o in variable["options"]] == ["scraped", "native"]
            assert variable["current"]["text"] == "scraped" and not variable["includeAll"]
        else:
            assert variable["query"].startswith("label_values(") and variable["allValue"] == ".*"


def test_latency_board_has_what_the_issue_asks_for():
    board = all_boards(slo.PRODUCTION)[0]
    stage_heatmap = board.panels[0]
    assert stage_heatmap.kind == "heatmap" and stage_heatmap.repeat == "stage" and stage_heatmap.exemplars
    assert {"$stage", "$qps_bucket"} <= set(re.findall(r"\$\w+", stage_heatmap.queries[0].expr))
    percentiles = next(p for p in board.panels if "P99" in p.title and p.kind == "timeseries")
    assert slo.SLO_SECONDS in percentiles.thresholds and percentiles.exemplars
    assert {v.name for v in board.variables} == {JOB, SOURCE, "stage", "qps_bucket"}


def test_latency_board_observes_the_graph_and_router_stages():
    """The knowledge-graph and router stages each have a heatmap (both sources), and the route mix and skipped stages
    a rate panel each, reading the families and label names the service exposes."""
    from rag.stages import SKIPPABLE_STAGES, STAGE_BY_NAME, STAGES

    board = all_boards(slo.PRODUCTION)[0]
    assert set(GRAPH_STAGES) <= set(STAGES) and {"link_entities", "retrieve_graph", "route"} <= set(GRAPH_STAGES)
    assert set(OWN_HEATMAP_STAGES) <= set(STAGES) and {"queue", "rerank", "cache_lookup", "hyde"} <= set(OWN_HEATMAP_STAGES)
    for stage in (*GRAPH_STAGES, *OWN_HEATMAP_STAGES):
        [heatmap] = [p for p in board.panels if p.kind == "heatmap" and p.title.endswith(f": {stage}")]
        assert [q.histograms for q in heatmap.queries] == [SCRAPED, NATIVE]
        assert all(f'stage="{stage}"' in q.expr for q in heatmap.queries), heatmap.queries
    by_title = {p.title: p for p in board.panels}
    [routes], [skipped] = by_title["Retrieval routes"].queries, by_title["Stages skipped"].queries
    assert (routes.sources, routes.legend) == ((contract.RETRIEVAL_ROUTES,), "{{retrieval_route}}")
    assert (skipped.sources, skipped.legend) == ((contract.STAGE_SKIPPED,), "{{stage}}")
    # The labels grouped by are the ones a scrape carries (a typo would draw one nameless line).
    registry = CollectorRegistry()
    PrometheusMetrics(registry, qps_labels=("0-1",))  # creates every closed-set series at zero
    labels = {s.name: set(s.labels) for family in text_string_to_metric_families(generate_latest(registry).decode())
              for s in family.samples}
    assert labels[contract.RETRIEVAL_ROUTES] == {"retrieval_route"}
    assert labels[contract.STAGE_SKIPPED] == {"stage"}
    # A skipped stage's latency has a panel too: a heatmap of its own, or the per-stage one of the stages every
    # request runs.
    assert all(s in GRAPH_STAGES or not STAGE_BY_NAME[s].conditional for s in SKIPPABLE_STAGES)
    assert {contract.RETRIEVAL_ROUTES, contract.STAGE_SKIPPED} <= set(EXPECTED_METRICS)


def test_quality_board_reads_the_quality_families_with_exemplars():
    """The Quality board: answers by verdict (stacked), the quality SLO's SLI, budget and burn rates (the SLO board's
    panels), a heatmap with exemplars for each signal of the closed set, the best similarity's median and P10 against
    the calibration's points, and the threshold; every family it reads is a quality family of ``METRICS``, with the
    labels the service writes, and Grafana provisions it with the other boards."""
    from rag.quality.signals import PER_SENTENCE_SIGNALS, QUALITY_SIGNALS, UNIT_SIGNALS

    board = next(b for b in all_boards(slo.PRODUCTION) if b.slug == "quality")
    specs = {m.name: m for m in METRICS}
    sources = {s for p in board.panels for q in p.queries for s in q.sources}
    assert sources == set(contract.QUALITY.values()) and sources <= set(specs)
    assert {specs[s].group for s in sources} == {"quality"}
    recorded = {slo.sli_error_record(slo.PRODUCTION.window(w)) for w in slo.SLI_WINDOWS_S}
    used = {t for p in board.panels for q in p.queries for t in METRIC_TOKEN.findall(q.expr)}
    assert used <= {name + suffix for name in specs for suffix in SUFFIXES} | recorded, used
    assert all(p.pipeline_only for p in board.panels)  # only ragheat's own pipeline judges its answers

    heatmaps = {p.title.rpartition(": ")[2]: p for p in board.panels if p.kind == "heatmap"}
    assert set(heatmaps) == set(QUALITY_SIGNALS) == set(SIGNAL_HEATMAPS)
    for signal, panel in heatmaps.items():
        [query] = panel.queries
        family = (contract.QUALITY_SCORE if signal in UNIT_SIGNALS else "ragheat_quality_sentence_citations"
                  if signal in PER_SENTENCE_SIGNALS else contract.RERANK_SCORE)
        assert query.sources == (family,) and f'signal="{signal}"' in query.expr, query
        assert panel.exemplars and not panel.log_y and panel.unit == "none"
    by_title = {p.title: p for p in board.panels}
    mix = by_title["Answers by verdict"]
    assert mix.stacked and [q.legend for q in mix.queries] == ["{{verdict}}"]
    drift = by_title["Best similarity against its calibration: drift"]
    assert drift.exemplars and [q.sources for q in drift.queries] == [
        (contract.QUALITY_SCORE,), (contract.QUALITY_SCORE,), (contract.CALIBRATION,)]
    points = set(re.search(r'point=~"([^"]+)"', drift.queries[2].expr).group(1).split("|"))
    assert points == {"p50", "p10", "threshold"} <= set(QUALITY_POINTS.values())
    titles = [p.title for p in board.panels]
    assert {"Quality SLI (5m)", "Quality error budget remaining (30d)", "Quality burn rate per window"} <= set(titles)
    assert all('slo="quality"' in q.expr for p in board.panels if p.title.startswith("Quality ")
               and p.kind != "heatmap" for q in p.queries)

    data = json.loads(grafana.dashboard_json(board))
    panels = {p["title"]: p for p in data["panels"]}
    assert panels["Answers by verdict"]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert all(t["exemplar"] for p in data["panels"] if p["type"] == "heatmap" for t in p["targets"])
    assert render.DASHBOARDS_DIR / "quality.json" in render.rendered_files(slo.PRODUCTION)

    # The labels grouped by and matched are the ones a scrape carries (the verdicts and signals at zero from the start).
    registry = CollectorRegistry()
    PrometheusMetrics(registry, qps_labels=("0-1",))
    labels = {s.name: set(s.labels) for family in text_string_to_metric_families(generate_latest(registry).decode())
              for s in family.samples}
    assert labels[contract.ANSWER_QUALITY] == {"verdict"}
    assert labels[contract.bucket(contract.QUALITY_SCORE)] == labels[contract.bucket(contract.RERANK_SCORE)] == {
        "signal", "le"}
    assert specs[contract.CALIBRATION].labels == ("signal", "point")


QUALITY_LEVEL_PANELS = ("Quality level now", "Answers by quality level", "Quality level changes",
                        "Queries by priority")


def test_slo_board_shows_the_quality_level_the_controller_serves():
    """The SLO board's load-controller panels: the rung now (the cheapest any worker serves, per job) as a gauge whose
    values read as the ladder's names in its order; the answers by the rung that served them, stacked, without the
    requests the pipeline did not answer; the steps per minute by direction; the queries by priority and outcome.
    Every family is a service family of ``METRICS``, grouped by the labels a scrape carries."""
    from rag.stages import LEVEL_DIRECTIONS, LEVEL_LABELS, PRIORITIES, PRIORITY_OUTCOMES, QUALITY_LEVELS

    assert contract.LEVELS == QUALITY_LEVELS and contract.LEVELS[0] == "full" and contract.LEVELS[-1] == "bm25_only"
    assert contract.NOT_ANSWERED in LEVEL_LABELS and contract.NOT_ANSWERED not in contract.LEVELS
    board = next(b for b in all_boards(slo.PRODUCTION) if b.slug == "slo")
    by_title = {p.title: p for p in board.panels}
    panels = [by_title[title] for title in QUALITY_LEVEL_PANELS]
    assert all(p.pipeline_only and p.description for p in panels)
    assert sum(p.width for p in panels) == 24  # one row
    specs = {m.name: m for m in METRICS}
    [[now], [mix], [changes], [priority]] = [p.queries for p in panels]

    assert panels[0].kind == "gauge" and now.sources == (contract.QUALITY_LEVEL,)
    assert now.expr.startswith(f"max by ({JOB}) ({contract.QUALITY_LEVEL}{{")  # per job, over its workers' pids
    assert panels[0].mappings == tuple(enumerate(QUALITY_LEVELS))
    assert mix.sources == (contract.REQUEST_DURATION,) and mix.histograms is None and panels[1].stacked
    assert f'{contract.count(contract.REQUEST_DURATION)}{{{ON_JOB}, quality_level!="none"}}' in mix.expr
    assert mix.expr.startswith("sum by (quality_level) (") and mix.legend == "{{quality_level}}"
    assert changes.sources == (contract.QUALITY_LEVEL_CHANGES,) and changes.expr.startswith("60 * sum by (direction)")
    assert panels[2].unit == "opm"  # the expression is per second times 60
    assert priority.sources == (contract.PRIORITY_REQUESTS,) and "sum by (priority, outcome)" in priority.expr
    assert {specs[q.sources[0]].group for q in (now, mix, changes, priority)} == {"service"}
    assert specs[contract.QUALITY_LEVEL].kind == "gauge"
    controller = {contract.QUALITY_LEVEL, contract.QUALITY_LEVEL_CHANGES, contract.PRIORITY_REQUESTS}
    assert controller <= contract.PIPELINE_ONLY

    # The labels grouped by and matched are the ones a scrape carries (directions and priorities at zero at start).
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, qps_labels=("0-1",))
    metrics.request_duration.labels(route="/v1/query", qps_bucket="0-1", outcome="ok",
                                    quality_level=QUALITY_LEVELS[3]).observe(0.1)
    samples = [s for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples]
    labels = {s.name: set(s.labels) for s in samples}
    assert "quality_level" in labels[contract.count(contract.REQUEST_DURATION)]
    assert labels[contract.QUALITY_LEVEL] == set()
    assert labels[contract.QUALITY_LEVEL_CHANGES] == {"direction"}
    assert labels[contract.PRIORITY_REQUESTS] == {"priority", "outcome"}
    assert {s.labels["direction"] for s in samples if s.name == contract.QUALITY_LEVEL_CHANGES} == set(LEVEL_DIRECTIONS)
    assert {(s.labels["priority"], s.labels["outcome"]) for s in samples if s.name == contract.PRIORITY_REQUESTS} == {
        (p, o) for p in PRIORITIES for o in PRIORITY_OUTCOMES}

    data = {p["title"]: p for p in json.loads(grafana.dashboard_json(board))["panels"]}
    gauge = data["Quality level now"]
    assert gauge["type"] == "gauge" and gauge["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]
    defaults = gauge["fieldConfig"]["defaults"]
    assert (defaults["min"], defaults["max"]) == (0, len(QUALITY_LEVELS) - 1)
    [mapping] = defaults["mappings"]
    assert mapping["type"] == "value"
    assert {int(v): m["text"] for v, m in mapping["options"].items()} == dict(enumerate(QUALITY_LEVELS))
    assert data["Answers by quality level"]["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


def test_the_quality_slo_counts_scored_answers_and_names_the_verdict():
    """Bad = the closed set's bad verdicts, the denominator every verdict but unscored, a missing bad series reads 0;
    each quality alert names the verdict and the drift, with queries of its own job only."""
    from rag.quality.signals import BAD_VERDICTS, QUALITY_VERDICTS

    assert contract.BAD == BAD_VERDICTS and {"good", contract.UNSCORED, *contract.BAD} == set(QUALITY_VERDICTS)
    ratio = slo.QUALITY.error_ratio("5m")
    assert f'verdict=~"{"|".join(BAD_VERDICTS)}"' in ratio and f'verdict!="{contract.UNSCORED}"' in ratio
    assert " or 0 * " in ratio  # no bad verdict yet: zero per job (promtool checks it in test_slo_rules.py)
    rules = slo.prometheus_rules(slo.PRODUCTION)
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r and r["labels"]["slo"] == "quality"
              and r["alert"] != quality.DRIFT_ALERT]  # drift pages on its own signals (test_quality_drift_rules.py)
    assert [a["labels"]["burn"] for a in alerts] == [a.speed for a in slo.BURN_ALERTS]
    for alert in alerts:
        assert alert["alert"] == "RagheatQualityBudgetBurn"
        assert {"verdict", "verdict_evidence", "drift"} <= set(alert["annotations"])
        assert not {"stage", "cause"} & set(alert["annotations"])
        assert alert["annotations"]["summary"].endswith(alert["annotations"]["verdict"])
    records = {r["record"] for g in rules["groups"] for r in g["rules"]
               if "record" in r and r.get("labels", {}).get("slo") == "quality"}
    assert records == {slo.sli_error_record(slo.PRODUCTION.window(w)) for w in slo.SLI_WINDOWS_S}


def test_provisioning_links_exemplars_to_traces():
    files = render.rendered_files(slo.PRODUCTION, render.Targets(prometheus_url="http://p:9", traces_url="http://t:3"))
    sources = yaml.safe_load(files[render.DATASOURCES_FILE])["datasources"]
    prometheus = next(s for s in sources if s["type"] == "prometheus")
    assert prometheus["uid"] == grafana.PROMETHEUS_UID and prometheus["url"] == "http://p:9"
    link = prometheus["jsonData"]["exemplarTraceIdDestinations"]
    assert [d["name"] for d in link] == ["trace_id"]
    assert link[0]["datasourceUid"] in {s["uid"] for s in sources if s["url"] == "http://t:3"}
    provider = yaml.safe_load(files[render.PROVIDER_FILE])["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"] == render.Targets().dashboards_path


def test_the_prometheus_datasource_presents_basic_auth_only_with_a_password_file():
    """Grafana reads the password from the file when it provisions ($__file{}): the rendered file never holds it."""
    def prometheus(targets: render.Targets) -> dict:
        sources = yaml.safe_load(render.rendered_files(slo.PRODUCTION, targets)[render.DATASOURCES_FILE])["datasources"]
        return next(s for s in sources if s["type"] == "prometheus")

    assert not {"basicAuth", "basicAuthUser", "secureJsonData"} & set(prometheus(render.Targets()))
    secured = prometheus(render.Targets(prometheus_password_file="/run/auth/password"))
    assert secured["basicAuth"] is True and secured["basicAuthUser"] == "ragheat"
    assert secured["secureJsonData"] == {"basicAuthPassword": "$__file{/run/auth/password}"}


def test_profiles_scale_every_window():
    def seconds(text: str) -> int:
        sizes = {"d": 86400, "h": 3600, "m": 60, "s": 1}
        return sum(int(n) * sizes[u] for n, u in re.findall(r"(\d+)([dhms])", text))

    for window in (*slo.SLI_WINDOWS_S, *slo.STAGE_P99_WINDOWS_S):
        for profile in slo.PROFILES.values():
            assert seconds(profile.window(window)) * profile.divisor == window
    with pytest.raises(ValueError, match="does not divide"):
        slo.Profile("odd", 7).window(300)
    test_rules = render.rendered_files(slo.TEST)[render.RULES_FILE]
    production_rules = render.rendered_files(slo.PRODUCTION)[render.RULES_FILE]
    assert slo.sli_error_record(slo.TEST.window(3600)) in test_rules
    assert slo.sli_error_record(slo.TEST.window(3600)) not in production_rules


def test_expand_fills_the_rate_window_and_variables():
    expr = 'sum by (le) (rate(x_bucket{stage=~"$stage", qps_bucket=~"$qps_bucket"}[$__rate_interval]))'
    assert expand(expr, "5s", {"stage": "fuse"}) == 'sum by (le) (rate(x_bucket{stage=~"fuse", qps_bucket=~".*"}[5s]))'


def test_heatmap_from_cumulative_buckets():
    def series(le: str, values: list[float]) -> dict:
        return {"metric": {"le": le}, "values": [[100 + i, str(v)] for i, v in enumerate(values)]}

    result = [series("0.1", [1, 0]), series("0.42", [3, 2]), series("1", [3, 5]), series("+Inf", [4, 5])]
    heatmap = heatmap_from_result("t", result)
    assert heatmap.rates.tolist() == [[1, 0], [2, 2], [0, 3]]  # per bucket, +Inf left out
    assert heatmap.edges.tolist()[1:] == [0.1, 0.42, 1.0]
    assert heatmap_from_result("t", [series("0.1", [0, 0]), series("1", [0, 0])]) is None


# --- the histogram source: scraped classic buckets or the collector's native histograms --------------------------


@pytest.mark.parametrize("slug", ["latency", "slo"])
def test_latency_panels_read_either_source(slug):
    """Every panel of the latency and SLO boards that reads a latency histogram has a scraped query and a native one,
    each gated by $source; panels reading counters, gauges or a histogram's counts alone (a request rate, no
    latency) run whatever the choice."""
    board = next(b for b in all_boards(slo.PRODUCTION) if b.slug == slug)
    assert any(isinstance(v, Choice) and v.name == SOURCE for v in board.variables)
    histogram_families = {contract.STAGE_DURATION, contract.REQUEST_DURATION}
    sourced = 0
    for panel in board.panels:
        kinds = [q.histograms for q in panel.queries]
        # The causes' ranking is recorded from the scraped buckets alone: it runs whatever the choice.
        ranked = all(q.expr.startswith(f"sort_desc({slo.why_names(slo.PRODUCTION).score}")
                     for q in panel.queries)
        counted = all(n.endswith("_count") for q in panel.queries for n in METRIC_TOKEN.findall(q.expr))
        if any(set(q.sources) & histogram_families for q in panel.queries) and not ranked and not counted:
            assert kinds.count(SCRAPED) == kinds.count(NATIVE) > 0, (panel.title, kinds)
            sourced += 1
        for q in panel.queries:
            names = set(METRIC_TOKEN.findall(q.expr))
            if q.histograms == SCRAPED:  # classic buckets, or a recording rule over them
                gate = "and on() (vector($source) == 0)"
                assert q.expr.endswith(gate) or ranked and q.expr.endswith(gate + ")"), q.expr
                assert all(n.endswith("_bucket") or ":" in n for n in names), names
            elif q.histograms == NATIVE:  # the native series themselves, never a bucket series
                assert q.expr.endswith("and on() (vector($source) == 1)")
                assert names and names <= {contract.NATIVE_STAGE_DURATION, contract.NATIVE_REQUEST_DURATION}, names
    assert sourced >= (3 if slug == "slo" else 4)


def test_a_query_no_source_gates_finds_its_histogram_only_in_the_scraped_series():
    """In a Prometheus holding only the native histograms, a count read whatever $source says (answers by quality
    level) has no series of its family: absent, while a gated query's missing classic buckets stay the wrong source
    chosen (checked empty)."""
    native_only = {contract.NATIVE_REQUEST_DURATION}
    assert family_present(contract.REQUEST_DURATION, native_only)
    assert not family_present(contract.REQUEST_DURATION, native_only, classic=True)
    assert family_present(contract.REQUEST_DURATION, {contract.count(contract.REQUEST_DURATION)}, classic=True)
    assert family_present(contract.QPS, {contract.QPS}, classic=True)  # a gauge's own name is its series


def test_native_histograms_are_named_as_the_collector_writes_them():
    assert contract.NATIVE_STAGE_DURATION == "ragheat_stage_duration_seconds"
    assert contract.NATIVE_REQUEST_DURATION == "ragheat_request_duration_seconds"


@pytest.mark.parametrize("profile", list(slo.PROFILES))
def test_promtool_parses_every_query_of_both_sources(profile, tmp_path):
    """The queries as Grafana sends them for each choice of $source (and the other variables at All) are valid PromQL:
    promtool checks them as recording rules. The native ones run against real native histograms in
    tests/dashboards/test_native_histograms.py; the scraped ones against the live service in test_dashboards_live.py."""
    import shutil
    import subprocess

    exprs = [expand(q.expr, "5m", {SOURCE: {SCRAPED: "0", NATIVE: "1"}[source]})
             for source in (SCRAPED, NATIVE) for board in all_boards(slo.PROFILES[profile])
             for panel in board.panels for q in panel.queries if selected(q, source)]
    rules = [{"record": f"check:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = subprocess.run([shutil.which("promtool") or "promtool", "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


# --- several services in one Prometheus: the job -----------------------------------------------------------------


@pytest.mark.parametrize("board", all_boards(slo.PRODUCTION), ids=lambda b: b.slug)
def test_every_board_has_a_job_variable_and_every_query_selects_it(board):
    """``$job`` comes first (the other label_values variables list values within the jobs chosen), is multi-select
    with All by default, and every series every query reads carries ``job=~"$job"``."""
    first, *others = board.variables
    assert isinstance(first, Variable) and first.name == JOB == first.label
    assert first.metric.endswith("_count") or first.metric.startswith('{__name__=~"'), first.metric
    template = json.loads(grafana.dashboard_json(board))["templating"]["list"][0]
    assert template["query"] == f"label_values({first.metric}, job)"
    assert (template["multi"], template["includeAll"], template["allValue"]) == (True, True, ".*")
    assert template["current"]["value"] == "$__all"
    for variable in others:
        if isinstance(variable, Variable):
            assert variable.metric.endswith(f"{{{ON_JOB}}}"), variable
    for panel in board.panels:
        for query in panel.queries:
            series = [m for m in re.finditer(METRIC_TOKEN, query.expr)]
            assert series, query.expr
            for match in series:
                assert query.expr[match.end():].startswith("{" + ON_JOB), (panel.title, match.group(0), query.expr)


def test_the_latency_and_slo_boards_list_the_jobs_that_serve_requests():
    jobs = {b.slug: b.variables[0].metric for b in all_boards(slo.PRODUCTION)}
    assert jobs["latency"] == jobs["slo"] == contract.count(contract.REQUEST_DURATION)
    assert jobs["kernel"] == contract.count(contract.KERNEL["runqueue"])
    assert jobs["milvus"] == contract.count(contract.MILVUS["search_latency"])  # Milvus' own job, not the service's
    # vLLM's engine and the service calling it are scraped as jobs of their own: the vLLM board lists both
    assert contract.count(contract.VLLM_NATIVE["ttft"]) in jobs["vllm"]
    assert contract.count(contract.GENERATION["ttft"]) in jobs["vllm"]


def test_stages_come_from_label_values_not_from_the_closed_set():
    """A service's own stage names (retrieve, tool, other) show on every per-stage panel without a change here: the
    only stages spelled in a query are those of the pipeline-only heatmaps."""
    for board in all_boards(slo.PRODUCTION):
        stage_variables = [v for v in board.variables if getattr(v, "label", None) == "stage"]
        assert all(isinstance(v, Variable) for v in stage_variables)
        for panel in board.panels:
            spelled = {m for q in panel.queries for m in re.findall(r'stage="(\w+)"', q.expr)}
            assert not spelled or panel.pipeline_only, (panel.title, spelled)


def test_the_library_families_are_the_service_families_any_service_emits():
    assert contract.LIBRARY == ("ragheat_stage_duration_seconds", "ragheat_request_duration_seconds",
                                "ragheat_requests_total", "ragheat_requests_in_flight", "ragheat_qps",
                                "ragheat_stage_errors_total", "ragheat_host_cpu_seconds_total",
                                "ragheat_host_pressure_stalled_seconds_total", "ragheat_process_cpu_seconds_total")
    assert not set(contract.LIBRARY) & contract.PIPELINE_ONLY
    assert {contract.CACHE_REQUESTS, contract.RETRIEVAL_ROUTES, contract.SHED, contract.SERVICE["index_reloads"],
            *contract.GENERATION.values()} <= contract.PIPELINE_ONLY


@pytest.mark.parametrize("board", all_boards(slo.PRODUCTION), ids=lambda b: b.slug)
def test_panels_only_the_pipeline_feeds_are_marked(board):
    """A panel reading only pipeline-only families is marked pipeline_only (checks skip it for a library-only
    service); a marked one reads nothing but those families or ragheat's own stages; the SLOs apply to every
    service, the load controller's panels beside them to ragheat's alone."""
    for panel in board.panels:
        sources = {s for q in panel.queries for s in q.sources}
        if sources <= contract.PIPELINE_ONLY:
            assert panel.pipeline_only, panel.title
        if panel.pipeline_only:
            assert sources <= contract.PIPELINE_ONLY | set(contract.LIBRARY), panel.title
    if board.slug == "slo":
        assert [p.title for p in board.panels if p.pipeline_only] == list(QUALITY_LEVEL_PANELS)
    if board.slug == "latency":
        marked = {p.title.rpartition(": ")[2] for p in board.panels if p.pipeline_only and p.kind == "heatmap"}
        assert marked == {*GRAPH_STAGES, *OWN_HEATMAP_STAGES}


def test_rules_keep_the_job_in_every_aggregation():
    """Two services never mix into one SLI: every sum keeps ``job`` (and the per-stage ones ``stage``); each alert's
    stage annotations look only at the alert's own job; Alertmanager groups and inhibits per job."""
    rules = slo.prometheus_rules(slo.PRODUCTION)
    annotation_queries = 0
    for group in rules["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            assert "sum(" not in expr and "vector(0)" not in expr, expr
            groupings = re.findall(r"\b(?:sum|max|quantile) by \(([^)]*)\)", expr)
            if "record" in rule:
                # A record with no aggregation of its own reads only records that keep the job.
                assert groupings or set(re.findall(r"[\w:]+(?=[{\[ ]|$)", expr)) & {
                    r["record"] for r in group["rules"] if "record" in r}, expr
                assert all("job" in g.split(", ") for g in groupings), expr
                if rule["record"].startswith("stage:"):
                    assert all("stage" in g.split(", ") for g in groupings), expr
            for text in rule.get("annotations", {}).values():
                for query in re.findall(r"range query \(printf \"([^\"]*)\" \$labels\.job[^)]*\)", text):
                    assert "{job=%q" in query, query
                    annotation_queries += 1
                assert "range query \"" not in text, text  # no query that ignores the alert's job
    assert annotation_queries >= len(slo.SLOS) * len(slo.BURN_ALERTS) * 2
    quality_queries = [q for g in rules["groups"] for r in g["rules"]
                       if "alert" in r and r["labels"]["slo"] == "quality" for text in r["annotations"].values()
                       for q in re.findall(r"range query \(printf \"([^\"]*)\" \$labels\.job", text)]
    assert len(quality_queries) >= len(slo.BURN_ALERTS) * 4 and all("{job=%q" in q for q in quality_queries)
    config = slo.alertmanager_config("http://p", "http://t")
    assert "job" in config["route"]["group_by"]
    assert config["inhibit_rules"][0]["equal"] == ["job", "slo"]


def test_recording_rule_names_do_not_change():
    """Other readers (boards elsewhere, stack checks) know these names: only their label sets grow."""
    records = {r["record"] for g in slo.prometheus_rules(slo.PRODUCTION)["groups"] for r in g["rules"] if "record" in r}
    stage = "stage:ragheat_stage_duration_seconds:"
    assert records == {*(stage + n for n in ("p50_rate5m", "p95_rate5m", "p99_rate5m", "p99_rate30m", "p99_rate6h",
                                             "over_slo_rate5m", "over_slo_rate30m", "over_slo_rate6h")),
                       *(f"slo:sli_error:ratio_rate{w}" for w in ("5m", "30m", "1h", "6h", "3d", "30d")),
                       "ragheat:why_cause:score5m", "ragheat:why_charge_ms:5m",
                       *(f"ragheat:why_{n}:{w}" for n in ("answered_per_s", "p99_ms", "stage_p99_ms", "process_cores",
                                                          "others_cores", "host_system_cores", "stalled_share",
                                                          "offered_per_s")
                         for w in ("5m", "baseline1h")),
                       *(f"ragheat:why_{n}:5m" for n in (
                           "p97_ms", "host_cores", "stage_growth_ms", "stage_ratio", "ordinary_ratio_median",
                           "stage_alone_ms", "stage_shared_ms", "load_cores", "reclaim_cores", "cores_beyond",
                           "cores_beyond_total",
                           "p99_growth_ms", "slower"))}


def test_a_job_is_matched_literally():
    expr = f'sum(rate(x{{{ON_JOB}}}[$__rate_interval]))'
    assert expand(expr, "5m", {JOB: regex_literal("rag-lib.v2")}) == r'sum(rate(x{job=~"rag-lib\\.v2"}[5m]))'
    assert expand(expr, "5m") == 'sum(rate(x{job=~".*"}[5m]))'  # All
    assert regex_literal('a|b"c') == r'a\\|b\"c'


def test_expand_gates_by_source():
    expr = 'sum(rate(x{stage=~"$stage"}[$__rate_interval])) and on() (vector($source) == 1)'
    assert expand(expr, "5s") == 'sum(rate(x{stage=~".*"}[5s])) and on() (vector(0) == 1)'  # default: scraped
    assert expand(expr, "5s", {SOURCE: "1"}).endswith("(vector(1) == 1)")


def test_the_causes_rules_weigh_as_explain_does():
    """dashboards.why writes explain.causes's thresholds and dependencies again (dashboards cannot import explain):
    they must be the same numbers, and its causes names of explain's kinds."""
    from typing import get_args

    from dashboards import why
    from explain import causes, signals
    from rag.stages import SLOWED_BY_DEPENDENCY

    for name in ("NOISE_MS", "NOISE_SHARE", "CORE_NOISE", "PRESSURE_NOISE", "TAIL_SHARE", "STANDS_OUT", "LOAD_GROWTH"):
        assert getattr(why, name) == getattr(causes, name), name
    assert why.QUANTILE == signals.QUANTILE
    # The rules charge a slowed stage to the dependencies explain reads from the stage table, and to nothing else.
    assert set(why.OWN_CAUSES) == {*SLOWED_BY_DEPENDENCY.values(), "stage"}
    assert set(why.CAUSES) <= set(get_args(causes.Kind)) and len(set(why.CAUSES)) == len(why.CAUSES)
