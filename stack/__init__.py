"""The whole ragheat stack: compose.yaml for Docker, and ``ragheat stack up/down`` for the same topology
without Docker on embedded defaults."""
