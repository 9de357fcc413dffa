"""Retrieval services built with other frameworks: plain, with ``ragheat.observe``, and under OpenTelemetry."""

from examples._shared import go_offline

go_offline()  # before any framework is imported: Haystack, for one, reads its usage-data switch at import
