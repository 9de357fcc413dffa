"""Prometheus and Alertmanager behind basic auth, as compose runs them: ``ragheat stack web-auth`` writes the web config
and the password, Debian's Prometheus and Alertmanager start with that ``--web.config.file``, and Prometheus runs
compose's own config (deploy/prometheus/prometheus.yml, targets on loopback, its ``basic_auth`` blocks reading the
generated password). A request without the password gets 401 from both; Prometheus' scrapes of itself and of
Alertmanager, and its alert deliveries, present it and work end to end."""

from __future__ import annotations

import shutil
import stat
import subprocess
import threading
import time
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml

from rag.childproc import ChildProcess, free_port
from rag.errors import ConfigurationError
from stack import topology
from stack.alert_receiver import AlertReceiver
from stack.webauth import PASSWORD_FILE, USER, WEB_CONFIG_FILE, ensure_web_auth
from tests.stack.conftest import RAGHEAT, tool

DRILL_ALERT = "WebAuthDrill"


def web_auth(folder: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([RAGHEAT, "stack", "web-auth", str(folder), *flags], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def auth(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stack") / "auth"
    result = web_auth(folder)
    assert result.returncode == 0, result.stderr
    return folder


def hash_of(folder: Path) -> str:
    return yaml.safe_load((folder / WEB_CONFIG_FILE).read_text())["basic_auth_users"][USER]


def test_web_auth_writes_a_private_password_and_its_bcrypt_hash(auth):
    password = (auth / PASSWORD_FILE).read_text()
    assert len(password) >= 32 and password == password.strip()
    assert stat.S_IMODE((auth / PASSWORD_FILE).stat().st_mode) == 0o600
    hashed = hash_of(auth)
    assert hashed.startswith("$2") and bcrypt.checkpw(password.encode(), hashed.encode())
    assert password not in (auth / WEB_CONFIG_FILE).read_text()


def test_web_auth_keeps_the_password_renews_it_on_demand_and_shares_it_in_compose(auth, tmp_path):
    """In this process (the command's own run is the fixture's): what a second run keeps and what it replaces."""
    folder = tmp_path / "auth"
    shutil.copytree(auth, folder)
    password, hashed = (folder / PASSWORD_FILE).read_text(), hash_of(folder)
    again = ensure_web_auth(folder)  # compose's one-shot runs at every `up`: clients keep their password
    assert not again.created and again.password == password and hash_of(folder) == hashed
    (folder / WEB_CONFIG_FILE).unlink()  # a lost web config is written again for the password already there
    ensure_web_auth(folder)
    assert (folder / PASSWORD_FILE).read_text() == password
    assert bcrypt.checkpw(password.encode(), hash_of(folder).encode())
    renewed = ensure_web_auth(folder, renew=True, world_readable=True)
    assert renewed.created and renewed.password != password
    assert bcrypt.checkpw(renewed.password.encode(), hash_of(folder).encode())
    assert stat.S_IMODE((folder / PASSWORD_FILE).stat().st_mode) == 0o644
    (folder / PASSWORD_FILE).write_text("")
    with pytest.raises(ConfigurationError, match="is empty.*--renew"):
        ensure_web_auth(folder)


@pytest.fixture(scope="module")
def secured(auth, tmp_path_factory):
    """Alertmanager, then Prometheus, both with the generated web config, and an alert receiver: (Prometheus URL,
    Alertmanager URL, the receiver). Prometheus evaluates one always-firing page alert every second."""
    folder = tmp_path_factory.mktemp("secured")
    receiver = AlertReceiver(("127.0.0.1", 0), out=open(folder / "receiver.log", "w"))
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    ports = {"prometheus": free_port(), "alertmanager": free_port()}
    addresses = topology.LocalAddresses({c: f"127.0.0.1:{p}" for c, p in ports.items()})
    rendered = folder / "rendered"
    (rendered / "prometheus").mkdir(parents=True)
    (rendered / "prometheus" / "drill.yml").write_text(yaml.safe_dump({"groups": [{
        "name": "web-auth-drill", "interval": "1s",
        "rules": [{"alert": DRILL_ALERT, "expr": "vector(1)", "labels": {"severity": "page"}}]}]}))
    alertmanager_config = folder / "alertmanager.yml"
    alertmanager_config.write_text(yaml.safe_dump({
        "route": {"receiver": "page", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "page", "webhook_configs": [
            {"url": f"http://127.0.0.1:{receiver.server_address[1]}/page", "send_resolved": False}]}]}))
    # compose's config and flags; scrape and evaluation every second (the test profile's divisor of 15 s).
    config, _ = topology.local_prometheus_config(addresses, rendered, time_divisor=15,
                                                 password_file=auth / PASSWORD_FILE)
    prometheus_config = folder / "prometheus.yml"
    prometheus_config.write_text(yaml.safe_dump(config))
    password = (auth / PASSWORD_FILE).read_text()
    with ChildProcess("alertmanager", [tool("prometheus-alertmanager", "Debian's package prometheus-alertmanager"),
                                       f"--config.file={alertmanager_config}", f"--storage.path={folder / 'am'}",
                                       f"--web.listen-address={addresses.components['alertmanager']}",
                                       "--cluster.listen-address=", f"--web.config.file={auth / WEB_CONFIG_FILE}"],
                      log_path=folder / "alertmanager.log", die_with_parent=True) as alertmanager, \
            ChildProcess("prometheus", [tool("prometheus", "Debian's package prometheus"),
                                        f"--config.file={prometheus_config}", f"--storage.tsdb.path={folder / 'tsdb'}",
                                        f"--web.listen-address={addresses.components['prometheus']}",
                                        *topology.prometheus_flags(), f"--web.config.file={auth / WEB_CONFIG_FILE}",
                                        # Alertmanager is found a few seconds after the first evaluation: resend the
                                        # firing alert every second, not every minute.
                                        "--rules.alert.resend-delay=1s"],
                         log_path=folder / "prometheus.log", die_with_parent=True) as prometheus:
        urls = {name: addresses.url(name) for name in ports}
        for child, url in ((alertmanager, urls["alertmanager"]), (prometheus, urls["prometheus"])):
            child.wait_until_ok(url.replace("//", f"//{USER}:{password}@") + "/-/ready", 30)
        yield urls, (USER, password), receiver
    receiver.shutdown()
    receiver.server_close()


@pytest.mark.parametrize("component, path", [
    ("prometheus", "/api/v1/query?query=up"), ("prometheus", "/-/ready"), ("prometheus", "/api/v1/write"),
    ("alertmanager", "/api/v2/silences"), ("alertmanager", "/api/v2/status")])
def test_a_request_without_the_password_gets_401(secured, component, path):
    urls, (user, password), _ = secured
    url = urls[component] + path
    method = "POST" if path.endswith("/write") else "GET"
    assert httpx.request(method, url, timeout=10).status_code == 401
    assert httpx.request(method, url, auth=(user, password + "x"), timeout=10).status_code == 401
    assert httpx.request(method, url, auth=("admin", password), timeout=10).status_code == 401
    if method == "GET":
        assert httpx.get(url, auth=(user, password), timeout=10).status_code == 200


@pytest.mark.slow
def test_the_stack_scrapes_and_delivers_alerts_with_the_password(secured):
    """compose's jobs for Prometheus and Alertmanager are up (each scrape presented the password), and the firing
    alert reached Alertmanager and, through it, the receiver (Prometheus' delivery presented it too)."""
    urls, auth, receiver = secured
    deadline, up, delivered = time.monotonic() + 45, {}, []
    while time.monotonic() < deadline and not (set(up) == {"prometheus", "alertmanager"} and delivered):
        result = httpx.get(urls["prometheus"] + "/api/v1/query", params={"query": "up"}, auth=auth,
                           timeout=10).json()["data"]["result"]
        up = {s["metric"]["job"]: s["value"][1] for s in result if s["value"][1] == "1"}
        delivered = [a for note in receiver.received for a in note["alerts"] if a["name"] == DRILL_ALERT]
        time.sleep(0.5)
    targets = httpx.get(urls["prometheus"] + "/api/v1/targets", auth=auth, timeout=10).json()["data"]
    assert set(up) == {"prometheus", "alertmanager"}, [(t["labels"]["job"], t["lastError"])
                                                      for t in targets["activeTargets"]]
    assert delivered and delivered[0]["labels"]["severity"] == "page", list(receiver.received)
    held = httpx.get(urls["alertmanager"] + "/api/v2/alerts", auth=auth, timeout=10).json()
    assert DRILL_ALERT in {a["labels"]["alertname"] for a in held}
