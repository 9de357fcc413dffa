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

from dashboards import contract, grafana, render, slo
from dashboards.boards import GRAPH_STAGES, OWN_HEATMAP_STAGES, all_boards
from dashboards.snapshot import heatmap_from_result
from dashboards.spec import NATIVE, SCRAPED, SOURCE, Choice, Variable, expand
from dashboards.verify import selected
from telemetry.metrics import EXPECTED_METRICS, PrometheusMetrics

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
METRIC_TOKEN = re.compile(r"(?<![\w:])((?:ragheat_|vllm:|stage:|slo:)[\w:]+)")
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
    families = [*contract.SERVICE.values(), *contract.GENERATION.values(), *contract.KERNEL.values(),
                *contract.VLLM.values(), *contract.VLLM_NATIVE.values()]
    known = {f + s for f in families for s in SUFFIXES}
    known |= {r["record"] for g in slo.prometheus_rules(slo.PROFILES[profile])["groups"] for r in g["rules"]
              if "record" in r}
    used = {token for expr in all_exprs(slo.PROFILES[profile]) for token in METRIC_TOKEN.findall(expr)}
    assert used and used <= known, sorted(used - known)
    # The service's own names really are what a scrape exposes.
    assert {contract.STAGE_DURATION, contract.REQUEST_DURATION, contract.REQUESTS} <= set(EXPECTED_METRICS)


def test_boards_read_every_kernel_and_vllm_family_they_promise():
    sources = {b.slug: {s for p in b.panels for q in p.queries for s in q.sources} for b in all_boards(slo.PRODUCTION)}
    assert {contract.KERNEL[k] for k in ("runqueue", "offcpu", "syscall")} <= sources["kernel"]
    assert set(contract.VLLM_NATIVE.values()) <= sources["vllm"]
    assert {contract.GENERATION[k] for k in ("ttft", "inter_token")} <= sources["vllm"]
    assert {contract.VLLM[k] for k in ("kv_usage", "preemptions")} <= sources["vllm"]


def test_slo_bucket_label_is_what_the_service_exposes():
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, qps_labels=("0-1",))
    metrics.request_duration.labels("/v1/query", "0-1", "ok").observe(0.1)
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
    assert {v.name for v in board.variables} == {SOURCE, "stage", "qps_bucket"}


def test_latency_board_observes_the_graph_and_router_stages():
    """The knowledge-graph and router stages each have a heatmap (both sources), and the route mix and skipped stages
    a rate panel each, reading the families and label names the service exposes."""
    from rag.stages import SKIPPABLE_STAGES, STAGES

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
    assert set(SKIPPABLE_STAGES) <= set(GRAPH_STAGES)  # a skipped stage's latency has a panel too
    assert {contract.RETRIEVAL_ROUTES, contract.STAGE_SKIPPED} <= set(EXPECTED_METRICS)


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
    each gated by $source; panels reading counters or gauges run whatever the choice."""
    board = next(b for b in all_boards(slo.PRODUCTION) if b.slug == slug)
    assert any(isinstance(v, Choice) and v.name == SOURCE for v in board.variables)
    histogram_families = {contract.STAGE_DURATION, contract.REQUEST_DURATION}
    sourced = 0
    for panel in board.panels:
        kinds = [q.histograms for q in panel.queries]
        if any(set(q.sources) & histogram_families for q in panel.queries):
            assert kinds.count(SCRAPED) == kinds.count(NATIVE) > 0, (panel.title, kinds)
            sourced += 1
        for q in panel.queries:
            names = set(METRIC_TOKEN.findall(q.expr))
            if q.histograms == SCRAPED:  # classic buckets, or a recording rule over them
                assert q.expr.endswith("and on() (vector($source) == 0)")
                assert all(n.endswith("_bucket") or ":" in n for n in names), names
            elif q.histograms == NATIVE:  # the native series themselves, never a bucket series
                assert q.expr.endswith("and on() (vector($source) == 1)")
                assert names and names <= {contract.NATIVE_STAGE_DURATION, contract.NATIVE_REQUEST_DURATION}, names
    assert sourced >= (3 if slug == "slo" else 4)


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


def test_expand_gates_by_source():
    expr = 'sum(rate(x{stage=~"$stage"}[$__rate_interval])) and on() (vector($source) == 1)'
    assert expand(expr, "5s") == 'sum(rate(x{stage=~".*"}[5s])) and on() (vector(0) == 1)'  # default: scraped
    assert expand(expr, "5s", {SOURCE: "1"}).endswith("(vector(1) == 1)")
