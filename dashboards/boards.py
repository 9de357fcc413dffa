"""The six boards: RAG latency, SLO, Quality, vLLM, Kernel, Milvus. Metric names come from ``dashboards.contract``,
window names and recording rules from ``dashboards.slo`` (so a profile renames both together).

Every board has a ``$job`` variable and every query selects ``job=~"$job"``: one Prometheus may scrape several
services. What adds up across services (bucket rates, request rates, gauges) is summed over the jobs selected; what
does not (quantiles, SLIs, burn rates, the per-stage recording rules) is drawn per job. Stage names always come from
``label_values``, so a service's own stage names (``retrieve``, ``tool``, ``other``) show without a change here."""

from __future__ import annotations

from dashboards import contract, quality
from dashboards.slo import (BURN_ALERTS, QUALITY, QUANTILE_WINDOW_S, SERVICE_SLOS, SLI_WINDOWS_S, SLO_PERIOD_S,
                            Profile, Slo, native_stage_over_slo_expr, sli_error_record, stage_over_slo_record,
                            stage_quantile_record, why_names)
from dashboards.spec import (JOB, NATIVE, ON_JOB, RATE_INTERVAL, SCRAPED, SOURCE_CHOICE, Board, Panel, Query,
                             Variable, gated)
from rag.slo import SLO_SECONDS
from rag.stages import QUALITY_SIGNALS

GRAPH_STAGES = ("link_entities", "retrieve_graph", "route")
"""The stages of the knowledge-graph path and the router (rag.stages.STAGES), each with a heatmap of its own: they run
only for requests that ask for the graph or the router, so on the repeated per-stage heatmap they would hide among
the stages every request runs."""
OWN_HEATMAP_STAGES = {
    "queue": ("Queue time", "The wait from a request's arrival to its first stage: for an admission slot and a "
                            "worker thread, and for an embedding micro-batch. End-to-end latency minus the stages "
                            "is this."),
    "cache_lookup": ("Answer cache lookup", "The semantic cache's lookup (cache.enabled): one matrix-vector product "
                                            "over the answers held; a hit ends the request here."),
    "rerank": ("Reranker", "Late-interaction rescoring of the fused candidates (rerank.enabled), after fuse."),
    "hyde": ("HyDE", "The language model writing a hypothetical passage for dense retrieval (hyde.enabled); skipped "
                     "when the model is slow or down."),
}
"""Stages that are not in every request, or that every request has but no stage heatmap shows well: each gets a
heatmap of its own, with what it is."""
SIGNAL_HEATMAPS = {
    "best_similarity": "The cosine of the question with the closest passage the dense retriever found (its own "
                       "search, before HyDE). Answers under the calibrated threshold have no good passage; a whole "
                       "distribution sliding down is traffic the corpus does not cover, or an index whose vectors no "
                       "longer match the query encoder.",
    "retriever_agreement": "The share of the dense retriever's top ten that BM25's top ten also holds: low when the "
                           "two disagree about what the question is about.",
    "fused_top": "Where the first fused passage's score lies between the least it can be (first in one list alone) "
                 "and the most (first in every list the question fused): 1 when the retrievers agree on the first "
                 "passage, 0 when no other puts it first. No value for an answer from one list.",
    "answer_support": "The share of a written answer's sentences the support check accepted (answers a language "
                      "model wrote); under quality.min_support the answer is unsupported.",
    "citations_per_sentence": "The citation markers a written answer's sentences carry, per sentence (answers a "
                              "language model wrote): a model that stops citing, or cites every passage everywhere, "
                              "moves it.",
    "rerank_top": "The reranker's score of the first passage, on its head's scale: questions the corpus covers score "
                  "high, others near zero.",
    "rerank_margin": "The first passage's lead over the second in the reranker's score: small when it cannot tell the "
                     "best passage from the next.",
}
"""Each quality signal (rag.quality.signals) with what it measures: a heatmap each on the Quality board."""


def _on_job(selector: str = "") -> str:
    """A selector's matchers, the ``$job`` one first."""
    return f"{ON_JOB}, {selector}" if selector else ON_JOB


def _rate(series: str, selector: str = "") -> str:
    return f"rate({series}{{{_on_job(selector)}}}[{RATE_INTERVAL}])"


def _gauge(series: str) -> str:
    return f"sum({series}{{{ON_JOB}}})"


def _job_variable(*families: str) -> Variable:
    """``$job``: the jobs that export ``families`` (series names), so each board lists the jobs that feed it."""
    metric = families[0] if len(families) == 1 else '{__name__=~"' + "|".join(families) + '"}'
    return Variable(JOB, metric, JOB)


def _by_job(family: str, label: str) -> Variable:
    """A variable listing ``label``'s values within the jobs ``$job`` selects."""
    return Variable(label, f"{family}{{{ON_JOB}}}", label)


def _heatmap(title: str, family: str, selector: str = "", native: str | None = None, log_y: bool = True,
             **options) -> Panel:
    """Buckets per le, ready for Grafana's heatmap (format ``heatmap``, one series per ``le``). With ``native`` (the
    collector-fed native histogram of the same latency), two queries gated by ``$source``: the scraped buckets and
    the native histogram, which Grafana draws with its own exponential buckets."""
    scraped = f"sum by (le) ({_rate(contract.bucket(family), selector)})"
    if native is None:
        return Panel(title, "heatmap", (Query(scraped, "{{le}}", (family,)),), log_y=log_y, **options)
    queries = (Query(gated(scraped, SCRAPED), "{{le}}", (family,), SCRAPED),
               Query(gated(f"sum({_rate(native, selector)})", NATIVE), "", (native,), NATIVE))
    return Panel(title, "heatmap", queries, log_y=log_y, **options)


def _quantile(q: float, family: str, native: str, selector: str) -> tuple[Query, Query]:
    """The ``q`` quantile per job from the scraped buckets and from the native histogram, each gated by
    ``$source``."""
    legend = f"{{{{{JOB}}}}} P{round(q * 100)}"
    scraped = f"histogram_quantile({q:g}, sum by ({JOB}, le) ({_rate(contract.bucket(family), selector)}))"
    native_ = f"histogram_quantile({q:g}, sum by ({JOB}) ({_rate(native, selector)}))"
    return (Query(gated(scraped, SCRAPED), legend, (family,), SCRAPED),
            Query(gated(native_, NATIVE), legend, (native,), NATIVE))


def latency_board(profile: Profile) -> Board:
    """RAG latency: per-stage heatmaps, end-to-end percentiles, load, errors. The latency panels read the scraped
    histograms or the collector-fed native ones, as ``$source`` says."""
    stage, request = contract.STAGE_DURATION, contract.REQUEST_DURATION
    load = 'qps_bucket=~"$qps_bucket"'
    answered = f'outcome="ok", {load}'
    selected_stage = 'stage=~"$stage"'
    hit, consulted, cache_off = 'result="hit"', 'result=~"hit|miss"', 'result="off"'
    busy, some = 'mode!~"idle|iowait|steal"', 'scope="some"'
    quantiles = tuple(query for q in (0.5, 0.95, 0.99)
                      for query in _quantile(q, request, contract.NATIVE_REQUEST_DURATION, answered))
    per_stage = f"{{{{{JOB}}}}} {{{{stage}}}}"  # the recording rules keep the job
    recorded = stage_quantile_record(0.99, profile)
    stage_p99 = (Query(gated(f"{recorded}{{{_on_job(selected_stage)}}}", SCRAPED), per_stage, (stage,), SCRAPED),
                 Query(gated(f"histogram_quantile(0.99, sum by ({JOB}, stage) (rate({contract.NATIVE_STAGE_DURATION}"
                             f"{{{_on_job(selected_stage)}}}[{profile.window(QUANTILE_WINDOW_S)}])))", NATIVE),
                       per_stage, (contract.NATIVE_STAGE_DURATION,), NATIVE))
    panels = (
        _heatmap("Stage latency: $stage", stage, f"{selected_stage}, {load}", native=contract.NATIVE_STAGE_DURATION,
                 repeat="stage", width=8, exemplars=True, thresholds=(SLO_SECONDS,),
                 description="Requests per second in each latency bucket of one pipeline stage (rows are the "
                             "buckets of telemetry.buckets, or the native histogram's 4.4 % buckets). Exemplars "
                             "link cells to the traces that landed there."),
        Panel("End-to-end latency P50 / P95 / P99", "timeseries", quantiles, thresholds=(SLO_SECONDS,), exemplars=True,
              description=f"Answered requests, as the server saw them; the line is the {SLO_SECONDS * 1000:g} ms objective."),
        _heatmap("End-to-end latency", request, answered, native=contract.NATIVE_REQUEST_DURATION, exemplars=True,
                 thresholds=(SLO_SECONDS,)),
        Panel(f"P99 by stage ({profile.window(QUANTILE_WINDOW_S)})", "timeseries", stage_p99, log_y=True,
              description=f"scraped: the recording rule {recorded}; native: the same quantile from the native "
                          "histograms."),
        Panel("Request rate", "timeseries",
              (Query(f"sum by (status_class) ({_rate(contract.REQUESTS)})", "{{status_class}}", (contract.REQUESTS,)),
               Query(_gauge(contract.QPS), "service qps window", (contract.QPS,))), unit="reqps"),
        Panel("Errors by stage", "timeseries",
              (Query(f"sum by (stage) ({_rate(contract.STAGE_ERRORS, selected_stage)})", "{{stage}}",
                     (contract.STAGE_ERRORS,)),), unit="reqps"),
        Panel(f"Stage alone over {SLO_SECONDS * 1000:g} ms (recorded, {profile.window(QUANTILE_WINDOW_S)})",
              "timeseries",
              (Query(gated(f"{stage_over_slo_record(profile, QUANTILE_WINDOW_S)}{{{_on_job(selected_stage)}}}",
                           SCRAPED), per_stage, (stage,), SCRAPED),
               Query(gated(native_stage_over_slo_expr(profile.window(QUANTILE_WINDOW_S),
                                                      _on_job(f'outcome="ok", {selected_stage}')), NATIVE),
                     per_stage, (contract.NATIVE_STAGE_DURATION,), NATIVE)),
              unit="reqps",
              description="Answered requests per second in which this stage alone took longer than the whole "
                          "objective: the stage a latency page names is the highest line here over its short window."),
        Panel("Requests in flight", "timeseries",
              (Query(f"sum by (route) ({contract.IN_FLIGHT}{{{ON_JOB}}})", "{{route}}", (contract.IN_FLIGHT,)),),
              unit="short"),
        Panel("CPU: the service and the rest of the host", "timeseries",
              (Query(f"sum({_rate(contract.HOST['process_cpu'])})", "service", (contract.HOST["process_cpu"],)),
               Query(f"max(sum by (instance) ({_rate(contract.HOST['host_cpu'], busy)})) - "
                     f"sum({_rate(contract.HOST['process_cpu'])})", "everything else on the host",
                     (contract.HOST["host_cpu"],))),
              unit="short", width=6,
              description="Cores in use: the service's own process, and the rest of the machine (busy CPU time from "
                          "/proc/stat minus the service's). A neighbour taking the CPU shows as the second line "
                          "rising while the first stays; `ragheat explain` reads the same two."),
        Panel("Pressure stalls", "timeseries",
              (Query(f"max by (resource) ({_rate(contract.HOST['pressure'], some)})", "{{resource}}",
                     (contract.HOST["pressure"],)),),
              unit="percentunit", width=6,
              description="Share of time some runnable task of the host stalled waiting for CPU, memory or I/O "
                          "(the kernel's pressure stall information): memory means reclaim or page faults (a cold "
                          "page cache), io a slow disk."),
        *(_heatmap(f"{'Router' if name == 'route' else 'Graph retrieval'} latency: {name}", stage,
                   f'stage="{name}", {load}', native=contract.NATIVE_STAGE_DURATION, width=8, exemplars=True,
                   pipeline_only=True, description="Requests per second in each latency bucket of this stage; it runs only for requests "
                               "that use the knowledge graph (graph, hybrid+graph) or the router (routed).")
          for name in GRAPH_STAGES),
        *(_heatmap(f"{title} latency: {name}", stage, f'stage="{name}", {load}', native=contract.NATIVE_STAGE_DURATION,
                   width=6, exemplars=True, pipeline_only=True,
                   description=f"Requests per second in each latency bucket. {description}")
          for name, (title, description) in OWN_HEATMAP_STAGES.items()),
        Panel("Retrieval routes", "timeseries",
              (Query(f"sum by (retrieval_route) ({_rate(contract.RETRIEVAL_ROUTES)})", "{{retrieval_route}}",
                     (contract.RETRIEVAL_ROUTES,)),), unit="reqps", pipeline_only=True,
              description="Answered queries per second by the retrievers that ran (hybrid = dense+bm25), or the "
                          "router's choice for routed queries; none = ended before retrieving."),
        Panel("Stages skipped", "timeseries",
              (Query(f"sum by (stage) ({_rate(contract.STAGE_SKIPPED)})", "{{stage}}", (contract.STAGE_SKIPPED,)),),
              unit="reqps", pipeline_only=True,
              description="Queries answered without a stage because its backend was down (the graph store stopped "
                          "or restarting), or because the request's remaining deadline could not hold its recent "
                          "time (admission.degrade); each such answer is flagged degraded."),
        Panel("Requests shed", "timeseries",
              (Query(f"sum by (reason) ({_rate(contract.SHED)})", "{{reason}}", (contract.SHED,)),), unit="reqps",
              pipeline_only=True, description="Queries refused at once with 503 and Retry-After by admission control: queue_full (the "
                          "bounded queue is full), deadline (predicted to finish after its deadline), expired (its "
                          "deadline passed while it waited). Answered quickly so the admitted ones keep the SLO."),
        Panel("Answer cache", "timeseries",
              (Query(f"sum({_rate(contract.CACHE_REQUESTS, hit)}) / "
                     f"clamp_min(sum({_rate(contract.CACHE_REQUESTS, consulted)}), 1e-9)", "hit ratio",
                     (contract.CACHE_REQUESTS,)),
               Query(f"sum({_rate(contract.CACHE_REQUESTS, cache_off)})", "answered with the cache off (req/s)",
                     (contract.CACHE_REQUESTS,))),
              unit="short", width=6, pipeline_only=True,
              description="The semantic answer cache (cache.enabled): hits over the queries that consulted it; a "
                          "service with it off shows only the second line."),
        Panel("Answer cache size", "timeseries",
              (Query(_gauge(contract.CACHE_ENTRIES), "entries", (contract.CACHE_ENTRIES,)),
               Query(_gauge(contract.CACHE_BYTES), "bytes", (contract.CACHE_BYTES,))),
              unit="short", width=6, pipeline_only=True,
              description="Answers the served generation's cache holds, and their estimated bytes (bounded by "
                          "cache.max_entries and cache.max_bytes; emptied when a new generation is swapped in)."),
    )
    variables = (_job_variable(contract.count(request)), SOURCE_CHOICE,
                 _by_job(contract.bucket(stage), "stage"), _by_job(contract.bucket(stage), "qps_bucket"))
    return Board("ragheat-latency", "RAG latency", "Per-stage latency heatmaps, end-to-end percentiles, load and errors.",
                 panels, variables)


def _slo_panels(slo: Slo, profile: Profile, **options) -> list[Panel]:
    """An objective's SLI, error budget remaining and burn rate per window, read off the recorded ratios; the latency
    SLO's also off the native histograms, as ``$source`` says."""
    job = f"{{{{{JOB}}}}}"  # the recorded ratios keep the job: one line per service
    short = profile.window(min(SLI_WINDOWS_S))
    period = profile.window(SLO_PERIOD_S)
    selector = "{" + _on_job(f'slo="{slo.name}"') + "}"

    def ratio(window: str, template: str, legend: str) -> tuple[Query, ...]:
        scraped = template.format(ratio=f"{sli_error_record(window)}{selector}")
        native = slo.native_error_ratio(window, _on_job('outcome="ok"'))
        if native is None:
            return (Query(scraped, legend, (slo.family,)),)
        return (Query(gated(scraped, SCRAPED), legend, (slo.family,), SCRAPED),
                Query(gated(template.format(ratio=f"({native})"), NATIVE), legend,
                      (contract.NATIVE_REQUEST_DURATION,), NATIVE))

    return [
        Panel(f"{slo.title} SLI ({short})", "timeseries", ratio(short, "1 - {ratio}", job),
              unit="percentunit", thresholds=(slo.objective,), width=8,
              description=f"Share of {slo.counted} that are good; bad = {slo.what}.", **options),
        Panel(f"{slo.title} error budget remaining ({period})", "stat",
              ratio(period, f"1 - {{ratio}} / {slo.budget:g}", job), unit="percentunit", width=8,
              description=f"1 - (bad share over {period}) / (1 - {slo.objective:g}); below 0 the SLO is missed.",
              **options),
        Panel(f"{slo.title} burn rate per window", "timeseries",
              tuple(q for w in SLI_WINDOWS_S
                    for q in ratio(profile.window(w), f"{{ratio}} / {slo.budget:g}", f"{job} {profile.window(w)}")),
              unit="short", thresholds=tuple(sorted({a.factor for a in BURN_ALERTS})), width=8,
              description="1 = spending the budget exactly over the period; the lines are the alert factors.",
              **options),
    ]


def _quality_level_panels() -> list[Panel]:
    """What the load controller (steering.enabled) traded to keep the objectives: the rung of the quality ladder it
    serves, the answers by the rung that served them, its steps, and the queries answered and refused by priority.
    Only ragheat's own pipeline steers."""
    job = f"{{{{{JOB}}}}}"
    levels = " > ".join(contract.LEVELS)
    answered = f'quality_level!="{contract.NOT_ANSWERED}"'
    return [
        Panel("Quality level now", "gauge",
              (Query(f"max by ({JOB}) ({contract.QUALITY_LEVEL}{{{ON_JOB}}})", job, (contract.QUALITY_LEVEL,)),),
              unit="none", mappings=tuple(enumerate(contract.LEVELS)), thresholds=(1,), width=6, pipeline_only=True,
              description=f"The quality ladder's rung the load controller serves new queries at, best first: "
                          f"{levels}. Each rung down drops one more cost (the hypothetical passage, the language "
                          "model, the knowledge graph, reranker depth, the reranker, dense retrieval) so the cores "
                          "keep up before admission control has to refuse anyone. Several worker processes or "
                          "replicas each step on their own: the gauge shows the cheapest rung any of them serves. "
                          "Full while steering is off."),
        Panel("Answers by quality level", "timeseries",
              (Query(f"sum by (quality_level) ({_rate(contract.count(contract.REQUEST_DURATION), answered)})",
                     "{{quality_level}}", (contract.REQUEST_DURATION,)),),
              unit="reqps", stacked=True, width=6, pipeline_only=True,
              description="Answered requests per second by the rung that answered them, stacked: the top of the "
                          "stack is every answer, the part under full what the controller traded for latency. "
                          f"Requests the pipeline did not answer (level {contract.NOT_ANSWERED}: refused, failed) "
                          "are left out: they are on Request rate and Requests shed. Read off the scraped "
                          "histogram's counts whatever $source says: the native histograms carry no level."),
        Panel("Quality level changes", "timeseries",
              (Query(f"60 * sum by (direction) ({_rate(contract.QUALITY_LEVEL_CHANGES)})", "{{direction}}",
                     (contract.QUALITY_LEVEL_CHANGES,)),),
              unit="opm", width=6, pipeline_only=True,
              description="The controller's steps per minute, down (cheaper answers) and up (back toward full), "
                          "over every worker process; one step down may skip several rungs in a burst. A burst "
                          "shows as downs, then ups once the load falls; downs and ups taking turns at a steady "
                          "load are a controller hunting between two rungs."),
        Panel("Queries by priority", "timeseries",
              (Query(f"sum by (priority, outcome) ({_rate(contract.PRIORITY_REQUESTS)})", "{{priority}} {{outcome}}",
                     (contract.PRIORITY_REQUESTS,)),),
              unit="reqps", width=6, pipeline_only=True,
              description="Queries per second by X-Request-Priority (high, normal, low), answered or refused by "
                          "admission control (shed). Once the controller has stepped down, low queries are answered "
                          "a rung below it and high ones a rung above, and low ones are refused first: in a burst "
                          "the low shed line rises while high answered holds."),
    ]


def slo_board(profile: Profile) -> Board:
    """SLO: each objective every service has, its SLI, remaining error budget and burn rates; the quality level the
    load controller traded for them; why the tail grew. The latency SLO's panels read the recorded ratios of the
    scraped histograms or compute the same from the native ones, as ``$source`` says. The quality SLO, which only
    ragheat's pipeline feeds, is on the Quality board."""
    panels = [panel for slo in SERVICE_SLOS for panel in _slo_panels(slo, profile)]
    panels += _quality_level_panels()
    job = f"{{{{{JOB}}}}}"
    names = why_names(profile)
    panels.append(Panel(
        f"Why: causes of a slower tail ({names.window} against the {names.baseline} before)", "bargauge",
        # The rules read the scraped histograms alone; a job with answers always has every cause. Sorted last:
        # the gate's `and` keeps no order.
        (Query(f"sort_desc({gated(f'{names.score}{{{ON_JOB}}}', SCRAPED)})", f"{job} {{{{cause}}}}",
               (contract.REQUEST_DURATION, contract.STAGE_DURATION), SCRAPED),),
        unit="ms", width=24,
        description="Milliseconds of stage P99 growth charged to each cause, largest first (recording rules of "
                    "dashboards/why.py, the ranking of `ragheat explain` in PromQL, read off the scraped histograms, so empty with $source at native): all zero while the P99 has not "
                    "grown beyond noise. The latency page names the top one (annotation `cause`). For the whole "
                    "evidence (the stages before and now, the slowest traces, what the kernel probes saw) run "
                    f"`ragheat explain --prometheus URL --job JOB --window {names.window}`."))
    return Board("ragheat-slo", "SLO", f"Latency and availability objectives, budgets and burn rates, the quality "
                 f"level traded for them ({profile.name} windows).",
                 tuple(panels), (_job_variable(contract.count(contract.REQUEST_DURATION)), SOURCE_CHOICE))


def _median_against(title: str, signal: str, points: str, point_legend: str, description: str) -> Panel:
    """A unit-interval quality signal's live median per job (``signal``: its selector) against the calibration
    gauge's ``points`` (a selector) that its drift alert compares it with."""
    job = f"{{{{{JOB}}}}}"
    return Panel(title, "timeseries",
                 (Query(f"histogram_quantile(0.5, sum by ({JOB}, le) "
                        f"({_rate(contract.bucket(contract.QUALITY_SCORE), signal)}))", f"{job} median",
                        (contract.QUALITY_SCORE,)),
                  Query(f"max by ({JOB}, point) ({contract.CALIBRATION}{{{_on_job(points)}}})",
                        f"{job} {point_legend}", (contract.CALIBRATION,))),
                 unit="none", exemplars=True, pipeline_only=True, description=description)


def quality_board(profile: Profile) -> Board:
    """Quality: the answers' verdicts, the quality SLO, each label-free signal as a heatmap, and the medians the drift
    alert reads against their references (best similarity, retriever agreement, written answers' support). Only
    ragheat's own pipeline judges its answers (quality.enabled)."""
    job = f"{{{{{JOB}}}}}"
    similarity = f'signal="{contract.BEST_SIMILARITY}"'
    calibrated = f'{similarity}, point=~"{contract.MEDIAN}|{contract.P10}|{contract.THRESHOLD}"'
    live = tuple(Query(f"histogram_quantile({q:g}, sum by ({JOB}, le) "
                       f"({_rate(contract.bucket(contract.QUALITY_SCORE), similarity)}))",
                       f"{job} {name}", (contract.QUALITY_SCORE,))
                 for q, name in ((0.5, "median"), (0.1, "P10")))
    agreement = f'signal="{contract.RETRIEVER_AGREEMENT}"'
    agreement_points = f'{agreement}, point=~"{contract.MEDIAN}|{contract.P05}"'
    support = f'signal="{contract.ANSWER_SUPPORT}"'
    support_point = f'{support}, point="{contract.THRESHOLD}"'
    verdicts = ", ".join(contract.VERDICTS)
    panels = (
        Panel("Answers by verdict", "timeseries",
              (Query(f"sum by (verdict) ({_rate(contract.ANSWER_QUALITY)})", "{{verdict}}",
                     (contract.ANSWER_QUALITY,)),),
              unit="reqps", stacked=True, pipeline_only=True,
              description=f"Answers per second by quality verdict ({verdicts}), stacked. "
                          f"{', '.join(contract.BAD)} spend the quality SLO's budget; {contract.UNSCORED} answers "
                          "(no dense search to judge by) count on neither side. A quality page names the bad verdict "
                          "with the most answers over its short window."),
        Panel("Best similarity against its calibration: drift", "timeseries",
              (*live, Query(f"max by ({JOB}, point) ({contract.CALIBRATION}{{{_on_job(calibrated)}}})",
                            f"{job} calibrated {{{{point}}}}", (contract.CALIBRATION,))),
              unit="none", exemplars=True, pipeline_only=True,
              description="The live median and 10th percentile of the best passage's similarity to the question, "
                          f"against the training questions' ({contract.MEDIAN}, {contract.P10}) and the threshold "
                          "under which an answer has no good passage (`ragheat calibrate-quality`). Lines sliding "
                          "under their calibrated twins are traffic the corpus does not cover, or an index whose "
                          "vectors no longer match the query encoder; a quality page quotes the median, and the "
                          f"{quality.DRIFT_ALERT} page fires when it stays under the {contract.P05} point."),
        _median_against("Retriever agreement against its calibration: drift", agreement, agreement_points,
                        "calibrated {{point}}",
                        "The live median share of the dense top 10 that BM25's top 10 also holds, against the "
                        f"training questions' ({contract.MEDIAN}, {contract.P05}). A median under {contract.P05} "
                        "with the similarity unmoved is a dense index whose vectors no longer match their chunks "
                        f"(shuffled, another generation's): the {quality.DRIFT_ALERT} page names this signal."),
        _median_against("Written answers' support against its threshold: drift", support, support_point,
                        "{{point}} (quality.min_support)",
                        "The live median share of a written answer's sentences the support check accepted, "
                        "against the least share a written answer needs (quality.min_support). A median under it "
                        "with the retrieval's signals unmoved is the language model: a worse or broken model "
                        f"behind the model server; the {quality.DRIFT_ALERT} page names this signal. No line "
                        "while the service answers extractively."),
        *_slo_panels(QUALITY, profile, pipeline_only=True),
        *(_heatmap(f"Quality signal: {signal}", contract.SIGNAL_FAMILY[signal], f'signal="{signal}"', log_y=False,
                   unit="none", width=8, exemplars=True, pipeline_only=True,
                   description=f"Answers per second in each bucket of this signal. {SIGNAL_HEATMAPS[signal]} "
                               "Exemplars link cells to the traces of the answers that landed there.")
          for signal in QUALITY_SIGNALS),
        Panel("Sampled judge: is the first passage relevant?", "timeseries",
              (Query(f"sum by (outcome) ({_rate(contract.JUDGED)})", "{{outcome}}", (contract.JUDGED,)),),
              unit="ops", stacked=True, width=8, pipeline_only=True,
              description="Answers per second whose first passage the language model judged, off the request path "
                          "(quality.judge_rate, off by default), by outcome: relevant, not_relevant, unparsed, failed "
                          "(the model unavailable), dropped (the judge's queue full). A signal only where the model's "
                          "agreement with human labels earns it: `ragheat judge` measures it (docs/quality.md)."),
        Panel("No good passage: the calibrated threshold", "stat",
              (Query(f"max by ({JOB}, point) ({contract.CALIBRATION}{{{_on_job(similarity)}}})", f"{job} {{{{point}}}}",
                     (contract.CALIBRATION,)),),
              unit="none", width=8, pipeline_only=True,
              description="An answer whose best passage's similarity to the question lies under the threshold gets "
                          "the verdict no_good_passage: the corpus likely holds nothing that answers it. "
                          "`ragheat calibrate-quality` runs the served pipeline over the corpus's own training "
                          "questions and sets the threshold at their flag-rate quantile (the p02 point by default), "
                          "so on traffic like theirs about that share of answers is flagged, and the quality "
                          "objective leaves the rest of its budget for what goes wrong. The other points are those "
                          "questions' quantiles, the reference the drift panel compares with. quality.min_similarity "
                          "overrides the threshold; a corpus or encoder of your own deserves its own calibration."),
    )
    return Board("ragheat-quality", "Quality",
                 f"Answer quality without labels: verdicts, the quality objective, signals and their drift "
                 f"({profile.name} windows).", panels, (_job_variable(contract.count(contract.QUALITY_SCORE)),))


def vllm_board(profile: Profile) -> Board:
    """vLLM: TTFT and inter-token latency (engine and client side), KV cache, queueing, preemptions."""
    native, ours, client = contract.VLLM_NATIVE, contract.VLLM, contract.GENERATION

    def gauge(title: str, unit: str, *pairs: tuple[str, str]) -> Panel:
        return Panel(title, "timeseries", tuple(Query(_gauge(name), legend, (name,)) for name, legend in pairs),
                     unit=unit, width=8)

    panels = (
        _heatmap("Time to first token (vLLM engine)", native["ttft"]),
        _heatmap("Time to first token (ragheat client)", client["ttft"], pipeline_only=True),
        _heatmap("Inter-token latency (vLLM engine)", native["inter_token"]),
        _heatmap("Inter-token latency (ragheat client)", client["inter_token"], pipeline_only=True),
        gauge("KV-cache usage", "percentunit", (native["kv_usage"], "vLLM"), (ours["kv_usage"], "ragheat plugin")),
        gauge("Running / waiting requests", "short", (native["running"], "running"), (native["waiting"], "waiting")),
        Panel("Preemptions", "timeseries",
              (Query(f"sum({_rate(native['preemptions'])})", "vLLM", (native["preemptions"],)),
               Query(f"sum({_rate(ours['preemptions'])})", "ragheat plugin", (ours["preemptions"],))),
              unit="ops", width=8),
        _heatmap("Engine step duration: $phase", ours["step_duration"], 'phase=~"$phase"', repeat="phase", width=8),
    )
    # vLLM's engine and the service that calls it are scraped as jobs of their own: $job lists both.
    variables = (_job_variable(contract.count(native["ttft"]), contract.count(client["ttft"])),
                 _by_job(contract.bucket(ours["step_duration"]), "phase"))
    return Board("ragheat-vllm", "vLLM", "Generation latency (TTFT, inter-token), KV cache, queueing and preemption.",
                 panels, variables)


def kernel_board(profile: Profile) -> Board:
    """Kernel: run-queue, off-CPU and syscall latency by stage (eBPF), TCP retransmits."""
    k = contract.KERNEL
    panels = (
        _heatmap("Run-queue latency: $stage", k["runqueue"], 'stage=~"$stage"', repeat="stage", width=8,
                 description="Wake-up to on-CPU, for threads running this stage (eBPF, log2 buckets)."),
        _heatmap("Off-CPU time: $stage", k["offcpu"], 'stage=~"$stage", reason=~"$reason"', repeat="stage", width=8),
        _heatmap("Syscall latency: $stage", k["syscall"], 'stage=~"$stage", family=~"$family"', repeat="stage", width=8),
        Panel("TCP retransmits", "timeseries",
              (Query(f"sum by (state) ({_rate(k['tcp_retransmits'])})", "{{state}}", (k["tcp_retransmits"],)),),
              unit="ops"),
    )
    variables = (_job_variable(contract.count(k["runqueue"])),
                 _by_job(contract.bucket(k["runqueue"]), "stage"),
                 _by_job(contract.bucket(k["offcpu"]), "reason"),
                 _by_job(contract.bucket(k["syscall"]), "family"))
    return Board("ragheat-kernel", "Kernel", "Scheduler and system-call time attributed to RAG stages by eBPF probes.",
                 panels, variables)


def milvus_board(profile: Profile) -> Board:
    """Milvus (``vector_store.backend=milvus``): its own timing of the searches ragheat sends, its requests by outcome,
    the entities it serves and its memory, from Milvus' own metrics (job ``milvus`` in compose's Prometheus)."""
    m, label = contract.MILVUS, contract.MILVUS_LABEL

    def summed_by(title: str, gauge: str, by: str, unit: str, description: str) -> Panel:
        return Panel(title, "timeseries", (Query(f"sum by ({by}) ({gauge}{{{ON_JOB}}})", f"{{{{{by}}}}}", (gauge,)),),
                     unit=unit, width=8, description=description)

    search = f'{label["query_type"]}="search"'
    outcomes = f'{label["status"]}!="total"'  # Milvus counts each call twice: as total, and by its outcome
    panels = (
        _heatmap("Search latency (Milvus proxy)", m["search_latency"], search, unit="ms",
                 description="A search from its arrival at Milvus' proxy to its answer, as Milvus times it (its "
                             "buckets, in milliseconds). The service's own view of the same searches, network and "
                             "client included, is the retrieve_dense and retrieve_bm25 stages on the RAG latency "
                             "board: the gap between the two is the trip."),
        _heatmap("Search latency (query node)", m["querynode_latency"], f'{search}, {label["scope"]}="OnLeader"',
                 unit="ms", description="A search as the query node that leads its shard serves it (scope OnLeader; "
                                        "its sub-searches on other nodes, FromLeader, are inside it)."),
        Panel("Requests by operation and outcome", "timeseries",
              (Query(f'sum by ({label["function"]}, {label["status"]}) ({_rate(m["requests"], outcomes)})',
                     f'{{{{{label["function"]}}}}} {{{{{label["status"]}}}}}', (m["requests"],)),),
              unit="reqps", width=8,
              description="Each proxy operation (Search, HybridSearch, Insert, CreateCollection, ...) per second by "
                          "outcome: an ingest publishing a generation shows as inserts and a collection made; "
                          "failed searches degrade the service's dense and BM25 stages."),
        summed_by("Entities served", m["entities"], label["collection"], "short",
                  "The rows the query node can search, per collection: ragheat publishes one collection per index "
                  "generation, so a hot swap shows the next one filling before the old one is dropped."),
        summed_by("Resident memory", m["resident_memory"], JOB, "bytes",
                  "Milvus' resident memory (its Go process collector): the memory the dense and BM25 indexes take "
                  "once they leave the service's process."),
    )
    return Board("ragheat-milvus", "Milvus", "The vector store as Milvus sees it: search latency, requests by outcome, "
                 "entities served, memory.", panels, (_job_variable(contract.count(m["search_latency"])),))


def all_boards(profile: Profile) -> tuple[Board, ...]:
    """Every board for ``profile``, in display order."""
    return tuple(build(profile) for build in (latency_board, slo_board, quality_board, vllm_board, kernel_board,
                                              milvus_board))
