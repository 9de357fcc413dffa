"""``ragheat bench``: an open-loop (Poisson, coordinated-omission-free) and closed-loop load generator
with rate sweeps, per-stage percentiles and knee detection against the latency SLO."""
