"""Answer quality without labels: signals measured on every request (``signals``), the calibration that turns them
into a verdict (``calibration``), and what the quality SLO counts."""
