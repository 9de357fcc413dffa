"""``ragheat explain``: why the tail latency of an observed service grew. ``signals`` reads every signal over a
window and a baseline from Prometheus; ``causes`` turns the differences into ranked causes, each with its evidence
and the milliseconds of the P99's growth it accounts for; ``report`` writes them for a person or as JSON."""
