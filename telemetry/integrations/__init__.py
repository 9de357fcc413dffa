"""Framework hooks: a Haystack tracer, a LlamaIndex span handler and a LangChain callback handler that turn each
framework's own per-component calls into ragheat stages of the current request, with one line of set-up:

    rh.haystack.enable(observer)        # haystack.tracing: a Tracer
    rh.llama_index.enable(observer)     # llama_index.core.instrumentation: a span handler
    rh.langchain.enable(observer)       # langchain_core callbacks: a handler on every run

Each module imports its framework only when a function of it is called, so importing ``ragheat.observe`` imports
none of them. A hook that cannot be set up (its framework missing) logs why and does nothing; a hook never raises
into the framework's call.
"""
