"""``ragheat tune``: the four-step tuning pipeline (labels, the reranker's head, the model server's batch limits,
hardware-aware placement) as one resumable run with a report of what each step bought (docs/tuning.md)."""
