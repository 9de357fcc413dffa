"""The committed Prometheus rules and Alertmanager config, checked by the real promtool and amtool, and the
burn-rate alerts unit-tested by ``promtool test rules`` on synthetic series built from the metrics contract."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from dashboards import contract, render, slo, yamlout
from rag.pipeline import STAGES
from telemetry.metrics import ROUTES

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULES = DASHBOARDS / render.RULES_FILE
ALERTMANAGER = DASHBOARDS / render.ALERTMANAGER_FILE
PER_MINUTE = 600  # requests per minute of synthetic traffic (10/s)
HEALTHY_HISTORY = 370  # minutes: more than the 6 h window, so the 6 h ratios start from a healthy past


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"the {name} binary is missing: install Debian's prometheus / prometheus-alertmanager packages "
                    "(scripts/install.sh --test does)")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


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
    for severity in ("page", "ticket"):
        routed = run(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}",
                     f"severity={severity}", "slo=latency")
        assert routed.returncode == 0, routed.stdout + routed.stderr
        assert routed.stdout.split() == [severity], routed.stdout


# --- promtool unit tests -------------------------------------------------------------------------------------


@dataclass
class Traffic:
    """Per-minute counts of one synthetic service: all requests, answered-but-slow ones, 5xx ones, and
    the stage to blame for both (slow in that stage, failing in that stage)."""

    total: list[int]
    slow: list[int]
    failed: list[int]
    stage: str

    @classmethod
    def phases(cls, stage: str, *phases: tuple[int, float, float]) -> "Traffic":
        """``(minutes, slow share, failed share)`` phases, one after another."""
        total, slow, failed = [], [], []
        for minutes, slow_share, failed_share in phases:
            total += [PER_MINUTE] * minutes
            slow += [round(PER_MINUTE * slow_share)] * minutes
            failed += [round(PER_MINUTE * failed_share)] * minutes
        return cls(total, slow, failed, stage)

    def series(self) -> list[dict]:
        answered = [t - f for t, f in zip(self.total, self.failed)]
        fast = [a - s for a, s in zip(answered, self.slow)]
        route, load = f'route="{ROUTES[0]}"', 'qps_bucket="10-50"'
        out = [
            _series(contract.count(contract.REQUEST_DURATION), f'{route}, {load}, outcome="ok"', answered),
            _series(contract.bucket(contract.REQUEST_DURATION), f'{route}, {load}, outcome="ok", le="{slo.SLO_LE}"', fast),
            _series(contract.bucket(contract.REQUEST_DURATION), f'{route}, {load}, outcome="ok", le="+Inf"', answered),
            _series(contract.REQUESTS, f'{route}, status_class="2xx"', answered),
            _series(contract.REQUESTS, f'{route}, status_class="5xx"', self.failed),
        ]
        for stage in STAGES:
            blamed = stage == self.stage
            under = fast if blamed else answered  # the blamed stage alone is slower than the objective
            for le, counts in (("0.01", under), (slo.SLO_LE, under), ("+Inf", answered)):
                out.append(_series(contract.bucket(contract.STAGE_DURATION),
                                   f'stage="{stage}", {load}, outcome="ok", le="{le}"', counts))
            out.append(_series(contract.STAGE_ERRORS, f'stage="{stage}"', self.failed if blamed else [0] * len(answered)))
        return out


def _series(name: str, labels: str, per_minute: list[int]) -> dict:
    values, running = ["0"], 0
    for n in per_minute:
        running += n
        values.append(str(running))
    return {"series": f"{name}{{{labels}}}", "values": " ".join(values)}


def expected(slo_: slo.Slo, speed: str, stage: str) -> dict:
    """The alert as promtool reports it: the rule's labels and its annotations with the stage filled in."""
    alert = next(a for a in slo.BURN_ALERTS if a.speed == speed)
    rule = slo.alert_rule(slo_, alert, slo.PRODUCTION)
    template = slo.stage_template(slo_, slo.PRODUCTION, alert.short_s)
    return {"exp_labels": rule["labels"],
            "exp_annotations": {k: v.replace(template, stage) for k, v in rule["annotations"].items()}}


def checks(slo_: slo.Slo, stage: str, at: dict[int, tuple[str, ...]]) -> list[dict]:
    """``{minute: firing speeds}`` -> promtool alert tests; an empty tuple means the SLO's alert stays quiet."""
    return [{"eval_time": f"{minute}m", "alertname": slo.alert_name(slo_),
             "exp_alerts": [expected(slo_, speed, stage) for speed in speeds]}
            for minute, speeds in at.items()]


H = HEALTHY_HISTORY
SCENARIOS = {
    # All answers slow (fuse): the 1 h ratio passes 14.4 % after 8.6 minutes, so it pages between minute 7
    # and 10; the 3 d ticket (its window holds only the short synthetic history) fires too, and is inhibited
    # by the page in Alertmanager. The 6 h page needs 21.6 minutes.
    "fast latency burn pages within 10 minutes, naming the stage": (
        Traffic.phases("fuse", (H, 0, 0), (25, 1.0, 0)),
        checks(slo.LATENCY, "fuse", {H - 1: (), H + 7: ("slow",), H + 10: ("fast", "slow"),
                                     H + 24: ("fast", "medium", "slow")})),
    # 2 % slow = 2x burn: the ticket opens once the 6 h and 3 d ratios pass 1 %; no page ever.
    "slow latency burn opens a ticket and never pages": (
        Traffic.phases("retrieve_dense", (60, 0, 0), (240, 0.02, 0)),
        checks(slo.LATENCY, "retrieve_dense", {90: (), 150: ("slow",), 240: ("slow",), 300: ("slow",)})),
    # Half the budget's rate (0.5 % slow, 0.05 % failed): quiet on both SLOs all along.
    "healthy service stays quiet": (
        Traffic.phases("embed", (400, 0.005, 0.0005)),
        checks(slo.LATENCY, "embed", {60: (), 200: (), 399: ()})
        + checks(slo.AVAILABILITY, "embed", {60: (), 200: (), 399: ()})),
    # Every answer slow for 3 minutes, shorter than the 5 m short window: the 1 h ratio peaks at 5 %.
    "spike shorter than the short window does not page": (
        Traffic.phases("embed", (H, 0, 0), (3, 1.0, 0), (30, 0, 0)),
        checks(slo.LATENCY, "embed", {H + 2: (), H + 3: (), H + 5: (), H + 10: (), H + 30: ()})),
    # 10 % of requests fail in retrieve_bm25 (budget 0.1 %): the fast page fires after ~9 minutes and names
    # the stage; answered requests stay fast, so the latency SLO is quiet.
    "availability fast burn pages, naming the failing stage": (
        Traffic.phases("retrieve_bm25", (H, 0, 0), (15, 0, 0.1)),
        checks(slo.AVAILABILITY, "retrieve_bm25", {H + 2: (), H + 12: ("fast", "slow")})
        + checks(slo.LATENCY, "retrieve_bm25", {H + 12: ()})),
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_promtool_unit_tests(scenario, tmp_path):
    traffic, alert_tests = SCENARIOS[scenario]
    shutil.copy(RULES, tmp_path / "rules.yml")
    test_file = tmp_path / "slo_test.yml"
    test_file.write_text(yamlout.dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"name": scenario, "interval": "1m", "input_series": traffic.series(),
                   "alert_rule_test": alert_tests}]}))
    result = run(tool("promtool"), "test", "rules", str(test_file))
    assert result.returncode == 0, f"{scenario}:\n{result.stdout}{result.stderr}"
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tmp_path):
    """Expecting silence during the fast burn must fail: the unit tests above are not vacuous."""
    traffic, _ = SCENARIOS["fast latency burn pages within 10 minutes, naming the stage"]
    shutil.copy(RULES, tmp_path / "rules.yml")
    test_file = tmp_path / "slo_test.yml"
    test_file.write_text(yamlout.dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": traffic.series(),
                   "alert_rule_test": checks(slo.LATENCY, "fuse", {H + 15: ()})}]}))
    result = run(tool("promtool"), "test", "rules", str(test_file))
    assert result.returncode != 0
    assert 'burn="fast"' in result.stdout + result.stderr
