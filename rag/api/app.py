"""The FastAPI service: ``create_app`` puts a pipeline and the server settings on ``app.state`` and adds the routes
(``rag.api.routes``), the body limit (``rag.api.middleware``) and the error handlers (``rag.api.errors``). The
index and model load in the lifespan, before the first request is accepted. OpenAPI at ``/docs``."""

from __future__ import annotations

import gc
import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from rag import __version__
from rag.api.errors import install_error_handlers
from rag.api.middleware import BodyLimitMiddleware
from rag.api.routes import router
from rag.pipeline import RagPipeline
from rag.settings import RagheatSettings
from rag.threadnames import set_name, stage_comm

log = logging.getLogger("ragheat.api")


@asynccontextmanager
async def lifespan(app: FastAPI):
    """Warm the pipeline up before serving (a missing or corrupt index fails start-up, naming the path); close it
    when the server stops."""
    pipeline: RagPipeline = app.state.pipeline
    if app.state.server.stage_thread_names:
        set_name(stage_comm("http"))  # the event-loop thread, for kernel probes (rag.threadnames)
    await run_in_threadpool(pipeline.warm_up)
    # The index, model and their Python objects live as long as the process: move them out of the garbage
    # collector's reach, so collections triggered by per-request allocations stop re-scanning them.
    gc.freeze()
    described = pipeline.describe()
    log.info("index %s loaded: %s chunks", described.index_folder, described.chunks)
    yield
    pipeline.close()  # the model client's connections, or the in-process engine's processes


def create_app(settings: RagheatSettings, index_dir: Path | None = None,
               pipeline: RagPipeline | None = None) -> FastAPI:
    """The app serving ``pipeline`` (or a new one over ``index_dir``, default ``server.index_dir``)."""
    app = FastAPI(title="ragheat", version=__version__, lifespan=lifespan,
                  description="Observability-first RAG: hybrid retrieval with cited, per-stage-timed answers.")
    app.state.pipeline = pipeline or RagPipeline(settings, index_dir or settings.server.index_dir)
    app.state.server = settings.server
    app.add_middleware(BodyLimitMiddleware, limit=settings.server.max_body_bytes)
    install_error_handlers(app)
    app.include_router(router)
    return app
