"""``ragheat serve`` and ``ragheat query``: serve the HTTP API, and answer one question (in-process or over HTTP)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from ragheat.clikit import fail as _fail, guard, load_settings, out

_guard = guard()


@_guard
def serve(
    index: Optional[Path] = typer.Option(None, "--index", help="index folder (default server.index_dir)"),
    host: Optional[str] = typer.Option(None, help="bind address"),
    port: Optional[int] = typer.Option(None, help="port"),
    log_level: str = typer.Option("info", help="uvicorn log level"),
    prometheus: bool = typer.Option(False, "--prometheus", help="also start a local Prometheus scraping this server"),
    telemetry_on: bool = typer.Option(True, "--telemetry/--no-telemetry", help="metrics, traces and OTLP export"),
    generator: Optional[str] = typer.Option(None, help="extractive | openai | vllm (see docs/vllm.md)"),
    llm_url: Optional[str] = typer.Option(None, "--llm-url", help="openai: the server's /v1 URL"),
    llm_model: Optional[str] = typer.Option(None, "--llm-model", help="openai: served model; vllm: model folder"),
    probes_on: bool = typer.Option(False, "--probes", help="also run the eBPF kernel probes in this process, "
                                                           "exported at /metrics (needs root or CAP_BPF+CAP_PERFMON; "
                                                           "with --workers N: one exporter for every worker, on "
                                                           "probes.port)"),
    api_keys_file: Optional[Path] = typer.Option(
        None, "--api-keys-file", help="require an API key from this file of hashed keys (`ragheat keys new`); keys "
                                      "themselves only via RAGHEAT_SERVER__API_KEYS, never on the command line"),
    insecure_no_api_key: bool = typer.Option(
        False, "--insecure-no-api-key", help="listen beyond loopback without any API key: anyone who reaches the "
                                             "port may query the API (logged as a warning). Without it, a host "
                                             "other than 127.0.0.0/8, ::1 or localhost needs a key"),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port",
                                               help="serve /metrics on this port instead of the API port"),
    reload_poll_s: Optional[float] = typer.Option(
        None, "--reload-poll", help="seconds between checks for a newer index generation, swapped in without a "
                                    "restart (0 = only on POST /admin/reload)"),
    workers: int = typer.Option(1, "--workers", min=1, max=64,
                                help="server processes on the one port (SO_REUSEPORT); their metrics are summed in "
                                     "every scrape (ragheat/workers.py)"),
    worker: Optional[int] = typer.Option(None, "--worker", hidden=True, help="set by --workers in each worker"),
    settings_file: Optional[Path] = typer.Option(None, "--settings", help="a JSON settings file (sections and "
                                                 "fields as in docs/settings.md; `ragheat tune` writes one): below "
                                                 "flags and RAGHEAT_* variables, above the defaults"),
) -> None:
    """Serve the HTTP API (OpenAPI docs at /docs, metrics at /metrics)."""
    import contextlib
    import signal

    import uvicorn

    from rag.api.access import OPEN_API_WARNING, open_api_problem, open_to_the_network
    from ragheat.commands.demo_llm import default_llm_model  # the installed real model, for --generator vllm
    from rag.slo import SLO_MS
    from ragheat.service import build_service

    if settings_file is not None:  # through the environment: --workers' workers read it too
        from rag.settings import SETTINGS_FILE_ENV

        os.environ[SETTINGS_FILE_ENV] = str(settings_file.resolve())
    settings = load_settings(server={"host": host, "port": port, "index_dir": index, "api_keys_file": api_keys_file,
                                     "metrics_port": metrics_port, "reload_poll_s": reload_poll_s,
                                     "insecure_no_api_key": insecure_no_api_key or None},
                             generation={"generator": generator, "base_url": llm_url,
                                         "model": llm_model or default_llm_model(generator)})
    # Before anything loads or binds, and in the --workers parent too: an API reachable from the network answers
    # only with a key, unless the operator named the risk.
    if problem := open_api_problem(settings.server):
        _fail(problem)
    metrics_on = telemetry_on and settings.telemetry.metrics
    if settings.generation.generator != "extractive" and settings.admission.enabled \
            and settings.admission.deadline_ms <= SLO_MS:
        # A model on CPU takes seconds; with the SLO as every request's deadline its answers would be skipped.
        out.print(f"[yellow]note: a request's deadline defaults to the SLO ({settings.admission.deadline_ms:g} ms); "
                  "the language model is skipped (extractive answer, degraded) when its recent time does not fit. "
                  "Send timeout_ms / X-Request-Timeout-Ms, or set RAGHEAT_ADMISSION__DEADLINE_MS (docs/reliability.md)[/]")
    if prometheus and not metrics_on:
        _fail("--prometheus needs metrics: drop --no-telemetry and keep telemetry.metrics on")
    if prometheus and settings.server.port == 0:
        _fail("--prometheus needs a fixed --port to scrape")
    keys_on = bool(settings.server.api_keys or settings.server.api_keys_file)
    if prometheus and keys_on and settings.server.metrics_port is None:
        _fail("--prometheus scrapes without a key: with API keys set, give /metrics its own --metrics-port")
    if probes_on and not metrics_on:
        _fail("--probes needs metrics: drop --no-telemetry and keep telemetry.metrics on")
    if workers > 1:  # this process only supervises: each worker is a `ragheat serve --worker i` of its own
        if problem := _workers_problem(settings):
            _fail(problem)
        _supervise(settings, workers, prometheus, probes_on)
        return
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if open_to_the_network(settings.server):  # only with insecure_no_api_key: open_api_problem stopped it otherwise
        logging.getLogger("ragheat.serve").warning(OPEN_API_WARNING, f"{settings.server.host}:{settings.server.port}")
    # A missing or corrupt index stops here, with its path, before anything binds. The probes never fail the
    # service: without privileges they log what is missing and it serves without them.
    multiprocess_dir = None
    if worker is not None:
        from ragheat.workers import MULTIPROC_ENV

        multiprocess_dir = os.environ.get(MULTIPROC_ENV)
        if not multiprocess_dir:
            _fail(f"--worker is set by --workers, which also sets {MULTIPROC_ENV}; run `ragheat serve --workers N`")
    with build_service(settings, telemetry=telemetry_on, probes=probes_on,
                       multiprocess_dir=multiprocess_dir) as service, \
            contextlib.ExitStack() as stack:
        if prometheus:
            from stack.prometheus import LocalPrometheus

            scrape_host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::") else settings.server.host
            scrape_port = settings.server.metrics_port or settings.server.port
            url = stack.enter_context(LocalPrometheus(f"{scrape_host}:{scrape_port}"))
            out.print(f"prometheus: {url}  (scraping http://{scrape_host}:{scrape_port}/metrics, "
                      "exemplar storage on)")
        # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit lets the
        # ExitStack stop the local Prometheus and the service its telemetry exporters instead of dying mid-way.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
        # Slow and oversized clients are cut off by the server settings' limits (rag.api.connections).
        server = uvicorn.Server(service.uvicorn_config(host=settings.server.host, port=settings.server.port,
                                                       log_level=log_level))
        if worker is None:
            server.run()
        else:  # bound only now, with the index loaded: the kernel never hands this worker a connection before
            from ragheat.workers import worker_socket

            server.run(sockets=[worker_socket(settings.server.host, settings.server.port)])


def _workers_problem(settings) -> str | None:
    """Why ``--workers`` > 1 cannot serve these settings (a sentence naming the option), or None."""
    if settings.server.port == 0:
        return "--workers > 1 needs a fixed --port: every worker binds the same one"
    if settings.server.metrics_port is not None:
        return "--workers > 1 serves /metrics on the API port (each scrape sums all workers); drop --metrics-port"
    if settings.generation.generator == "vllm":
        return "--generator vllm with --workers > 1 would start one engine per worker on the GPU; use one worker"
    if settings.server.reload_poll_s == 0:
        return ("--workers > 1 needs --reload-poll > 0: POST /admin/reload reaches one worker, and the others follow "
                "a new index generation on their own poll of its `current` link")
    return None


def _supervise(settings, workers: int, prometheus: bool, probes_on: bool) -> None:
    """The parent of ``--workers``: a local Prometheus (``--prometheus``), the workers, and with ``--probes`` one
    ``ragheat probes`` exporter for all of them on ``probes.port`` (the kernel maps are the host's: one set of
    programs counts every worker's threads, by stage), until stopped."""
    import contextlib

    from ragheat.workers import supervise

    argv = sys.argv[sys.argv.index("serve") + 1:] if "serve" in sys.argv else []
    scrape_host = "127.0.0.1" if settings.server.host in ("0.0.0.0", "::") else settings.server.host
    service_url = f"http://{scrape_host}:{settings.server.port}"
    probes = None
    if probes_on:
        probes = [str(Path(sys.executable).parent / "ragheat"), "probes", "--service-url", service_url,
                  "--host", "127.0.0.1", "--port", str(settings.probes.port)]
        out.print(f"kernel probes: http://127.0.0.1:{settings.probes.port}/metrics (every worker, once they answer)")
    with contextlib.ExitStack() as stack:
        if prometheus:
            from stack.prometheus import LocalPrometheus

            extra = {"ragheat-probes": f"127.0.0.1:{settings.probes.port}"} if probes_on else None
            url = stack.enter_context(LocalPrometheus(f"{scrape_host}:{settings.server.port}", extra_targets=extra))
            out.print(f"prometheus: {url}  (scraping {service_url}/metrics: {workers} workers summed)")
        out.print(f"ragheat serve: {workers} workers on {settings.server.host}:{settings.server.port}")
        code = supervise(argv, workers, min_uptime_s=settings.server.worker_min_uptime_s, probes=probes,
                         ready_url=service_url + "/readyz")
    if code:
        raise typer.Exit(code)


@_guard
def query(
    text: str = typer.Argument(..., help="the question"),
    index: Optional[Path] = typer.Option(None, "--index", help="answer in-process from this index"),
    url: Optional[str] = typer.Option(None, help="ask a running server instead, e.g. http://127.0.0.1:8000"),
    top_k: int = typer.Option(5, min=1, max=100, help="sources to return"),
    retrievers: Optional[str] = typer.Option(
        None, help="comma list of dense, bm25, graph (fused when several), +-joined names (hybrid = dense+bm25, "
                   "hybrid+graph), or routed alone (the router picks per query); default: retrieval.retrievers"),
    as_json: bool = typer.Option(False, "--json", help="print the raw response"),
) -> None:
    """Answer one question with citations and per-stage timings."""
    names = [r.strip() for r in retrievers.split(",")] if retrievers else None
    body = {"query": text, "top_k": top_k, **({"retrievers": names} if names else {})}
    if url:
        import httpx

        response = httpx.post(url.rstrip("/") + "/v1/query", json=body, timeout=60)
        if response.status_code != 200:
            _fail(f"{response.status_code}: {response.json().get('reason', response.text)}")
        data = response.json()
    else:
        from pydantic import ValidationError

        from rag.api.schemas import QueryRequest, QueryResponse
        from rag.pipeline import RagPipeline

        settings = load_settings(server={"index_dir": index})
        try:
            request = QueryRequest(**body)
        except ValidationError as exc:
            _fail(exc.errors()[0]["msg"].removeprefix("Value error, "))
        pipeline = RagPipeline(settings, settings.server.index_dir)
        pipeline.warm_up()
        data = QueryResponse.from_result(pipeline.query(request.query.strip(), top_k, names)).model_dump()
    if as_json:
        out.print_json(json.dumps(data))
    else:
        print_answer(data)


def print_answer(data: dict) -> None:
    """The answer, its citations and the stage timings, for a terminal."""
    out.print(f"[bold]{data['answer']}[/]  [dim]({data['generator']})[/]")
    for c in data["citations"]:
        out.print(f"  [{c['number']}] {c['title']} [dim]({c['doc_id']} {c['chunk_start']}:{c['chunk_end']}, "
                  f"score {c['score']:.4f})[/]")
    out.print("  " + "  ".join(f"{s['name']} {s['ms']:.2f} ms" for s in data["stages"]), style="dim")
