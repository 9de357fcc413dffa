"""The composition root: the ``ragheat`` command (``ragheat.cli``, one module per command group under
``ragheat.commands``) and the wiring of a served pipeline with its app, telemetry and probes
(``ragheat.service``). It imports every other package; no package imports it."""
