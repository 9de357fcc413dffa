"""What the rule tests share: the committed rule file and Alertmanager config, the real promtool and amtool, and one
``promtool test rules`` run over synthetic series."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards import render, yamlout

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULES = DASHBOARDS / render.RULES_FILE
ALERTMANAGER = DASHBOARDS / render.ALERTMANAGER_FILE


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"the {name} binary is missing: install Debian's prometheus / prometheus-alertmanager packages "
                    "(scripts/install.sh --test does)")
    return path


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def promtool_test(tmp_path: Path, name: str, series: list[dict], alert_tests: list[dict],
                  expr_tests: list[dict] = ()) -> subprocess.CompletedProcess:
    shutil.copy(RULES, tmp_path / "rules.yml")
    test_file = tmp_path / "slo_test.yml"
    # Records before the alerts that read them, as the rule file lists them (promtool's default is by name, which
    # would show the alerts each record one evaluation late).
    order = [g["name"] for g in yaml.safe_load(RULES.read_text())["groups"]]
    test_file.write_text(yamlout.dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m", "group_eval_order": order,
        "tests": [{"name": name, "interval": "1m", "input_series": series, "alert_rule_test": alert_tests,
                   "promql_expr_test": list(expr_tests)}]}))
    return run(tool("promtool"), "test", "rules", str(test_file))
