"""Step 3: the model server's batch limits, from a sweep of ``max_num_seqs`` x ``max_model_len`` cells
(``loadgen.vllm_tuning.run_tuning``, one fresh server per cell under the same open-loop load): the cell with the most
output tokens per second among those that met the model's latency objective and did not fail. None met it: the limits
are left as they are, and the report says so."""

from __future__ import annotations


def choose_model_limits(sweep: dict) -> dict:
    """Step 3's result from a sweep's results (``results.json``'s form): ``chosen`` (the cell) and ``settings``
    (the ``generation`` section's vLLM limits) when a cell qualifies; ``reason`` either way."""
    meeting = [c for c in sweep["cells"] if c.get("meets_slo") and not c.get("failure")]
    if not meeting:
        return {"ran": True, "reason": "no cell of the sweep met the model's SLO: the limits are left as they are",
                "sweep": sweep}
    best = max(meeting, key=lambda c: c["tokens_per_s"])
    return {"ran": True, "sweep": sweep, "chosen": best,
            "reason": f"max_num_seqs {best['max_num_seqs']} x max_model_len {best['max_model_len']}: the most "
                      f"tokens/s ({best['tokens_per_s']:.1f}) among the cells meeting the SLO",
            "settings": {"generation": {"vllm_max_num_seqs": best["max_num_seqs"],
                                        "vllm_max_model_len": best["max_model_len"]}}}
