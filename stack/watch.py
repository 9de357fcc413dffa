"""``ragheat stack up --watch-url URL``: the stack's Prometheus, SLO rules and Alertmanager around a service that
ragheat did not start, and with ``--watch-pid PID`` the eBPF probes on that service's process.

The watched service is any process serving ragheat's metric families at a Prometheus endpoint (a RAG service using
ragheat's instrumentation library, or ``ragheat serve`` run elsewhere). The rules select no job, so its
``ragheat_*`` series feed the same SLO rules as the stack's own API. Nothing of the service is started or stopped:
``stack down`` leaves it running.

An unreachable URL at start is a warning, not an error: a watched service may be restarting or start after the
stack, and Prometheus retries every scrape (the target shows down, and ``stack status`` exits 1, until it answers).
A malformed URL, a job name the stack already uses and a pid that does not run are refused before anything starts:
the first two are configuration mistakes, and probes on a dead pid would have nothing to attach to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx

from rag.errors import ConfigurationError
from stack.processes import start_time
from stack.topology import JOB_COMPONENTS

DEFAULT_JOB = "service"
_JOB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")
REACH_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class WatchPlan:
    """What to watch: the scrape URLs (one Prometheus job), the job's name, and the processes to probe."""

    urls: tuple[str, ...] = ()
    job: str = DEFAULT_JOB
    pids: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.urls or self.pids)

    def describe(self) -> str:
        parts = [f"{', '.join(self.urls)} as job {self.job}"] if self.urls else []
        if self.pids:
            parts.append(f"the eBPF probes on pid {', '.join(map(str, self.pids))}")
        return "watching " + " and ".join(parts) + ": no ragheat API or vLLM is started"


def target_group(url: str) -> dict:
    """One ``static_configs`` entry scraping ``url``: its host:port as the target, and its scheme, path and query as
    the target's ``__scheme__``, ``__metrics_path__`` and ``__param_*`` labels, which Prometheus uses in place of the
    job's defaults. So URLs with different paths share one job. ``ConfigurationError`` for anything but an
    http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"--watch-url {url!r} is not an http(s) URL with a host "
                                 f"(e.g. http://127.0.0.1:8000/metrics)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigurationError(f"--watch-url {url!r} has an invalid port") from None
    if parts.username or parts.password or parts.fragment:
        raise ConfigurationError(f"--watch-url {url!r}: credentials and fragments are not supported")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    labels = {"__scheme__": parts.scheme, "__metrics_path__": parts.path or "/metrics"}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        labels[f"__param_{key}"] = value
    return {"targets": [f"{host}:{port}"], "labels": labels}


def scrape_job(plan: WatchPlan) -> dict:
    """The Prometheus job scraping every watched URL."""
    return {"job_name": plan.job, "static_configs": [target_group(url) for url in plan.urls]}


def plan_problems(plan: WatchPlan, proc: Path = Path("/proc")) -> list[str]:
    """What makes ``plan`` impossible, each in a sentence naming the flag; [] when it can start."""
    problems = []
    for url in plan.urls:
        try:
            target_group(url)
        except ConfigurationError as exc:
            problems.append(str(exc))
    if plan.urls and not _JOB_NAME.match(plan.job):
        problems.append(f"--watch-job {plan.job!r} must start with a letter or underscore and hold only letters, "
                        f"digits, '_', '.' and '-'")
    if plan.urls and plan.job in JOB_COMPONENTS:
        problems.append(f"--watch-job {plan.job} is a job the stack itself scrapes; choose another name")
    for pid in plan.pids:
        if pid <= 0 or start_time(pid, proc) is None:
            problems.append(f"--watch-pid {pid}: no process with that pid is running (it exited, or never ran); "
                            f"the probes would have nothing to attach to")
    return problems


def unreachable(urls: tuple[str, ...], timeout_s: float = REACH_TIMEOUT_S) -> list[str]:
    """A sentence for each URL that does not answer 200 now (the stack starts anyway: see the module docstring)."""
    found = []
    for url in urls:
        try:
            status = httpx.get(url, timeout=timeout_s).status_code
        except httpx.HTTPError as exc:
            found.append(f"{url} did not answer ({type(exc).__name__}: {exc})")
            continue
        if status != 200:
            found.append(f"{url} answered HTTP {status}")
    return found
