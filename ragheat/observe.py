"""ragheat's observing half for a RAG service it did not write (docs/observe-your-service.md).

    import ragheat.observe as rh

    observer = rh.Observer(service="my-rag", routes=("/query",))
    rh.instrument(app, observer)                  # Starlette/FastAPI: times the routes, serves GET /metrics
    with rh.stage("retrieve_bm25"): ...           # or @rh.stage("embed") on a def or async def

    provider.add_span_processor(rh.StageSpanProcessor(observer))  # an app already traced by OpenInference,
                                                                  # OpenLLMetry or OpenLIT: no code change
    rh.haystack.enable(observer)    # or rh.llama_index / rh.langchain: each framework's components as stages, through
                                    # its own tracing or callback hook

Importing this module imports no command, server or pipeline of ragheat (only ``telemetry`` and the settings), and
no framework: each hook imports its own when enabled.
"""

from rag.settings import TelemetrySettings
from telemetry.integrations import haystack, langchain, llama_index
from telemetry.metrics import STAGE_LABELS
from telemetry.observe import (ObserveMiddleware, Observer, OpenStage, RequestObservation, StageScope,
                               current_observer, instrument, stage)
from telemetry.span_stages import StageSpanProcessor, span_stage
from telemetry.stage_names import ALIASES, StageNames

__all__ = ["ALIASES", "ObserveMiddleware", "Observer", "OpenStage", "RequestObservation", "STAGE_LABELS", "StageNames",
           "StageScope", "StageSpanProcessor", "TelemetrySettings", "current_observer", "haystack", "instrument",
           "langchain", "llama_index", "span_stage", "stage"]
