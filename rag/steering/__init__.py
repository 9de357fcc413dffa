"""Steering under load: the quality ladder a service can step down (``rag.stages.LEVEL_TABLE``), what each rung
costs and buys (``ladder``), and the controller that picks the rung from the live load (``controller``). The API runs
the controller on its event loop (``rag.api.steering``)."""
