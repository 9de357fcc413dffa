"""The FastAPI service: ``create_app`` puts the ``IndexGenerationSwitch`` serving a pipeline, the access policy and the
server settings on ``app.state`` and adds the routes (``rag.api.routes``), the middleware (``rag.api.middleware``:
access, body limit, generation leases), the error handlers (``rag.api.errors``) and the completed OpenAPI schema
(``rag.api.openapi``). The index and model load in the lifespan, before the first request is accepted; from then on
newer generations are swapped in without a restart (``rag.index_generations``). OpenAPI at ``/docs``."""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from rag import __version__
from rag.api.access import AccessPolicy
from rag.api.admission import AdmissionController, ArrivalMiddleware
from rag.api.errors import install_error_handlers
from rag.api.middleware import AccessMiddleware, BodyLimitMiddleware, IndexGenerationMiddleware
from rag.api.openapi import install_openapi
from rag.api.routes import router
from rag.api.steering import Steering
from rag.index_generations import IndexGenerationSwitch
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from rag.threadnames import set_name, stage_comm

log = logging.getLogger("ragheat.api")


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Warm the pipeline up before serving (a missing or corrupt index fails start-up, naming the path); close it
    when the server stops."""
    switch: IndexGenerationSwitch = app.state.generations
    if app.state.server.stage_thread_names:
        set_name(stage_comm("http"))  # the event-loop thread, for kernel probes (rag.threadnames)
    await run_in_threadpool(switch.warm_up)
    # The index, model and their Python objects live until the next generation is swapped in: move them out of the
    # garbage collector's reach, so collections triggered by per-request allocations stop re-scanning them (a swap
    # freezes the new one too, and collects the whole heap only when a reference cycle keeps the old one alive:
    # rag.index_generations).
    gc.freeze()
    described = switch.current.describe()
    log.info("index %s loaded: %s chunks", described.index_folder, described.chunks)
    switch.watch(app.state.server.reload_poll_s)
    if app.state.steering is not None:
        app.state.steering.start()
    yield
    if app.state.steering is not None:
        await app.state.steering.stop()
    switch.close()  # every generation: the model client's connections or in-process engine, graph store children


def create_app(settings: RagheatSettings, index_dir: Path | None = None,
               pipeline: RagPipeline | None = None) -> FastAPI:
    """The app serving ``pipeline`` (or a new one over ``index_dir``, default ``server.index_dir``)."""
    app = FastAPI(title="ragheat", version=__version__, lifespan=lifespan,
                  description="Observability-first RAG: hybrid retrieval with cited, per-stage-timed answers.")
    switch = IndexGenerationSwitch(pipeline or RagPipeline(settings, index_dir or settings.server.index_dir))
    access = AccessPolicy.from_settings(settings.server)  # a bad keys file fails here, before anything binds
    app.state.generations, app.state.access, app.state.server = switch, access, settings.server
    app.state.admission = AdmissionController.from_settings(settings.admission)
    app.state.steering = Steering.from_settings(settings, app.state.admission) if settings.steering.enabled else None
    # Starlette runs the last added outermost: access (before any body is read), body limit, generation lease.
    app.add_middleware(IndexGenerationMiddleware, switch=switch)
    app.add_middleware(BodyLimitMiddleware, limit=settings.server.max_body_bytes, rejections=access.rejections)
    app.add_middleware(AccessMiddleware, policy=access)
    app.add_middleware(ArrivalMiddleware)  # outermost of the app's own: a query's queue stage starts here
    install_error_handlers(app)
    app.include_router(router)
    install_openapi(app, settings.server, access.keys.enabled,
                    lambda: switch.current if switch.ready else None)
    return app
