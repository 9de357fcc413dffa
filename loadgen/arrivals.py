"""When requests are meant to be sent: Poisson arrivals for open-loop load, and rate sweeps."""

from __future__ import annotations

import numpy as np


def poisson_offsets(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Intended send times (seconds from the start) of a Poisson process of ``rate`` per second.

    Gaps are exponential with mean 1/rate, so requests bunch and spread as independent users' do;
    a fixed-interval schedule would hide the queueing that bursts cause.
    """
    if not rate > 0 or not duration_s > 0:
        raise ValueError(f"rate ({rate}) and duration_s ({duration_s}) must be positive")
    expected = rate * duration_s
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(expected + 6 * np.sqrt(expected) + 16)))
    while times[-1] < duration_s:  # rare: the draw fell short of the window; extend it
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=len(times)))])
    return times[times < duration_s]


def parse_rates(spec: str) -> list[float]:
    """``"5,10,20"`` or ``"start:stop:step"`` (stop included) -> offered rates in requests per second."""
    spec = spec.strip()
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if not (start > 0 and step > 0 and stop >= start):
                raise ValueError
            count = int(np.floor((stop - start) / step + 1e-9)) + 1
            rates = [round(start + i * step, 6) for i in range(count)]
        else:
            rates = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates takes '5,10,20' or 'start:stop:step' with positive numbers; got {spec!r}") from None
    if not rates or any(not r > 0 for r in rates):
        raise ValueError(f"--rates must be positive; got {spec!r}")
    return rates
