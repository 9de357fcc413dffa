"""The service level objectives, their windows, and the Prometheus rules and Alertmanager routes built from them.

Three objectives over 30 days: 99 % of answered requests within ``rag.slo.SLO_SECONDS`` (420 ms), read
off the histogram's exact ``le="0.42"`` bucket, 99.9 % of requests not failing with a 5xx, and 95 % of scored answers
judged good (``dashboards.quality``; only ragheat's own pipeline judges its answers). Each gets the multi-window,
multi-burn-rate alerts of the SRE workbook (chapter 5, "Alerting on SLOs"):

=========  ======  ===========  ============  ==============================================
severity   burn    long window  short window  meaning
=========  ======  ===========  ============  ==============================================
page       14.4x   1 h          5 m           2 % of the 30-day budget gone in one hour
page       6x      6 h          30 m          5 % gone in six hours
ticket     1x      3 d          6 h           10 % gone in three days: on track to miss the SLO
=========  ======  ===========  ============  ==============================================

Both windows must burn: the long one says the burn is significant, the short one that it is still going on
(so an alert resolves minutes after the problem does, and a spike shorter than the short window never pages).

Each alert names **the stage to look at first** (annotations ``stage`` and ``stage_evidence``), computed over the
alert's short window when it fires:

- latency: the stage that, on its own, took longer than the whole objective (420 ms) in the most answered
  requests per second. Such a request is bad whatever the other stages did, so this stage explains at least that
  many bad requests; it is an absolute count, so a cheap stage whose time merely doubled is never named over an
  expensive one that crossed the objective, and a stage that is always slow but rarely runs (an LLM path taken by
  a few requests) is not named over one that makes every request slow. When no stage alone crossed the objective
  (the time is spread over several stages), the stage with the highest P99 is named instead, and the evidence
  says so.
- availability: the stage in which the most requests per second failed; "none" when no pipeline stage failed.

The quality alerts name no stage: they name the bad verdict that dominates and how far the best similarity drifted from
its calibration (annotations ``verdict``, ``verdict_evidence`` and ``drift``, ``dashboards.quality``).

The latency alerts also name **the cause** of the slower tail (annotations ``cause`` and ``cause_evidence``): the top
of ``dashboards.why``'s recorded ranking over the last 5 minutes against the hour before, as ``ragheat explain``
ranks it.

Every rule keeps the scrape job (``job``, :data:`KEPT`): several services scraped by one Prometheus each get their own
SLI, stage series and alerts, and the stage an alert names is looked up in its own job's series.

A :class:`Profile` divides every window: ``PRODUCTION`` keeps them, ``TEST`` turns hours into minutes so a live
test can watch an alert fire in seconds. Dashboards and rules are rendered from the same profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.utils import floatToGoString

from dashboards import contract, quality, why
from dashboards.spec import JOB
from rag.slo import SLO_SECONDS

MINUTE, HOUR, DAY = 60, 3600, 86400
SLO_PERIOD_S = 30 * DAY
SLO_LE = floatToGoString(SLO_SECONDS)
"""The ``le`` label value of the SLO bucket, spelled exactly as prometheus_client writes it."""

KEPT = JOB
"""The label every rule's aggregation keeps: one service never mixes into another's SLI or alert."""

QUANTILES = (0.5, 0.95, 0.99)
QUANTILE_WINDOW_S = 5 * MINUTE
"""Window of the per-stage quantile recording rules read by dashboards."""


@dataclass(frozen=True)
class Profile:
    """How rules and dashboards are rendered: every window (and the quantile rate window) divided by ``divisor``."""

    name: str
    divisor: int

    def window(self, seconds: int) -> str:
        """A Prometheus duration for ``seconds`` of production time, e.g. ``1h``, ``5s``, ``1h12m``."""
        scaled = seconds // self.divisor
        if scaled * self.divisor != seconds or scaled < 1:
            raise ValueError(f"profile {self.name}: {seconds} s does not divide into whole seconds by {self.divisor}")
        text = ""
        for unit, size in (("d", DAY), ("h", HOUR), ("m", MINUTE), ("s", 1)):
            if scaled >= size:
                text += f"{scaled // size}{unit}"
                scaled %= size
        return text


PRODUCTION = Profile("production", 1)
TEST = Profile("test", 60)
"""Hours become minutes and minutes seconds: the fast-burn page reads a 60 s and a 5 s window."""
PROFILES = {p.name: p for p in (PRODUCTION, TEST)}


@dataclass(frozen=True)
class BurnAlert:
    """One multi-window burn-rate alert: its factor, long and short windows, and severity."""

    severity: str      # page | ticket: the Alertmanager route
    speed: str         # fast | medium | slow: a stable label for dashboards and silences
    factor: float      # burn rate: how many times faster than "exactly spend the budget in 30 days"
    long_s: int
    short_s: int


BURN_ALERTS = (
    BurnAlert("page", "fast", 14.4, 1 * HOUR, 5 * MINUTE),
    BurnAlert("page", "medium", 6.0, 6 * HOUR, 30 * MINUTE),
    BurnAlert("ticket", "slow", 1.0, 3 * DAY, 6 * HOUR),
)
SLI_WINDOWS_S = tuple(sorted({w for a in BURN_ALERTS for w in (a.long_s, a.short_s)} | {SLO_PERIOD_S}))
STAGE_P99_WINDOWS_S = tuple(sorted({QUANTILE_WINDOW_S} | {a.short_s for a in BURN_ALERTS}))


@dataclass(frozen=True)
class Slo:
    """An objective: the share of good events over the period, and what makes one bad."""

    name: str
    title: str
    objective: float
    what: str  # one phrase: what a bad event is
    family: str  # the family its SLI reads, for the boards' checks
    counted: str = "requests"  # what its events are
    min_events: int = 0  # events the short window must hold for an alert to fire (0: no floor)

    @property
    def budget(self) -> float:
        return 1 - self.objective

    def events(self, window: str) -> str:
        """PromQL: the events counted over ``window``, per job (the quality SLO's: scored answers)."""
        if self.name != "quality":
            raise ValueError(f"{self.name}: only the quality SLO counts a floor of events")
        return quality.scored(window)

    def error_ratio(self, window: str) -> str:
        """PromQL: the share of bad events over ``window``, per job."""
        if self.name == "latency":
            ok = 'outcome="ok"'
            good = f'sum by ({KEPT}) (rate({contract.bucket(contract.REQUEST_DURATION)}{{{ok}, le="{SLO_LE}"}}[{window}]))'
            total = f"sum by ({KEPT}) (rate({contract.count(contract.REQUEST_DURATION)}{{{ok}}}[{window}]))"
            return f"1 - ({good} / {total})"
        if self.name == "quality":
            return quality.error_ratio(window)
        # A service may create its 5xx series only with the first failure; until then its bad rate is 0, not
        # missing: zero per job, as a bare vector(0) would match no job.
        total = f"sum by ({KEPT}) (rate({contract.REQUESTS}[{window}]))"
        bad = f'(sum by ({KEPT}) (rate({contract.REQUESTS}{{status_class="5xx"}}[{window}])) or 0 * {total})'
        return f"{bad} / {total}"

    def native_error_ratio(self, window: str, selector: str = 'outcome="ok"') -> str | None:
        """PromQL: the latency SLO's bad share over ``window`` per job, read off the collector-fed native histogram
        (``selector``: its answered requests), for the SLO board's ``native`` source (``histogram_fraction``
        interpolates inside the 4.4 % bucket holding 420 ms). None for availability, which reads no histogram. The
        alerts read the scraped ``le="0.42"`` bucket only."""
        if self.name != "latency":
            return None
        return (f"1 - histogram_fraction(0, {SLO_LE}, "
                f"sum by ({KEPT}) (rate({contract.NATIVE_REQUEST_DURATION}{{{selector}}}[{window}])))")

    def stage_query(self, profile: Profile, short_s: int) -> str:
        """PromQL naming the stage burning this budget (see the module docstring) in one job: one series with a
        ``stage`` label, or none. A ``printf`` format: ``%q`` is where the alert's job goes."""
        if self.name == "latency":
            return f"topk(1, {stage_over_slo_record(profile, short_s)}{{{KEPT}=%q}} > 0)"
        errors = f"rate({contract.STAGE_ERRORS}{{{KEPT}=%q}}[{profile.window(short_s)}])"
        return f"topk(1, sum by (stage) ({errors}) > 0)"

    def fallback_query(self, profile: Profile, short_s: int) -> str | None:
        """When ``stage_query`` finds nothing: the latency SLO names the stage with the highest P99 (a ``printf``
        format, as ``stage_query``)."""
        if self.name != "latency":
            return None
        return f"topk(1, {stage_quantile_record(0.99, profile, short_s)}{{{KEPT}=%q}} > 0)"


LATENCY = Slo("latency", "Latency", 0.99, f"an answered request slower than {SLO_SECONDS * 1000:g} ms",
              contract.REQUEST_DURATION)
AVAILABILITY = Slo("availability", "Availability", 0.999, "a request answered with a 5xx status", contract.REQUESTS)
QUALITY = Slo("quality", "Quality", 0.95,
              f"an answer judged {', '.join(contract.BAD[:-1])} or {contract.BAD[-1]}; {contract.UNSCORED} ones count "
              "on neither side", contract.ANSWER_QUALITY, counted="scored answers",
              min_events=quality.MIN_SCORED)
SERVICE_SLOS = (LATENCY, AVAILABILITY)
"""The objectives every service has, a library-only one too: the SLO board's."""
SLOS = (*SERVICE_SLOS, QUALITY)


def why_names(profile: Profile) -> why.Names:
    """The names of the causes' records (``dashboards.why``) in ``profile``'s windows."""
    return why.Names(profile.window(why.WINDOW_S), profile.window(why.BASELINE_S))


def sli_error_record(window: str) -> str:
    """Name of the recording rule holding an SLO's bad-event ratio over ``window`` (label ``slo``)."""
    return f"slo:sli_error:ratio_rate{window}"


def stage_quantile_record(quantile: float, profile: Profile, window_s: int = QUANTILE_WINDOW_S) -> str:
    """Name of the recording rule holding a per-stage latency quantile over the profile's window."""
    return f"stage:{contract.STAGE_DURATION}:p{round(quantile * 100):d}_rate{profile.window(window_s)}"


def stage_over_slo_record(profile: Profile, window_s: int) -> str:
    """Name of the recording rule holding, per stage, the answered requests per second in which that stage alone
    took longer than the objective."""
    return f"stage:{contract.STAGE_DURATION}:over_slo_rate{profile.window(window_s)}"


def stage_over_slo_expr(window: str) -> str:
    """PromQL of ``stage_over_slo_record``: all answered executions minus those within the SLO bucket, per job and
    stage."""
    ok, by = 'outcome="ok"', f"sum by ({KEPT}, stage)"
    return (f"{by} (rate({contract.count(contract.STAGE_DURATION)}{{{ok}}}[{window}]))\n"
            f"- {by} (rate({contract.bucket(contract.STAGE_DURATION)}{{{ok}, le=\"{SLO_LE}\"}}[{window}]))")


def native_stage_over_slo_expr(window: str, selector: str = 'outcome="ok"') -> str:
    """The same rate per job and stage read off the collector-fed native histograms (interpolated at 420 ms)."""
    rate = f"sum by ({KEPT}, stage) (rate({contract.NATIVE_STAGE_DURATION}{{{selector}}}[{window}]))"
    return f"histogram_count({rate}) * histogram_fraction({SLO_LE}, Inf, {rate})"


def alert_name(slo: Slo) -> str:
    """The alert name of an SLO's burn-rate alerts."""
    return f"Ragheat{slo.title}BudgetBurn"


def _in_job(query_format: str) -> str:
    """A Go template action header running ``query_format`` (a ``printf`` format) for the alert's own job."""
    return f'{{{{ range query (printf "{query_format}" $labels.{KEPT}) }}}}'


def stage_template(slo: Slo, profile: Profile, short_s: int) -> str:
    """Annotation text naming the stage to blame (a Prometheus template query), or the fallback's stage."""
    # Go template, evaluated by Prometheus at each evaluation: a query, not a label, so the alert keeps one
    # identity even if the named stage changes while it fires.
    fallback = slo.fallback_query(profile, short_s)
    otherwise = (f'{_in_job(fallback)}{{{{ .Labels.stage }}}}{{{{ else }}}}unknown{{{{ end }}}}'
                 if fallback else "none")
    return f'{_in_job(slo.stage_query(profile, short_s))}{{{{ .Labels.stage }}}}{{{{ else }}}}{otherwise}{{{{ end }}}}'


def stage_evidence_template(slo: Slo, profile: Profile, short_s: int) -> str:
    """Annotation sentence saying why that stage is named, with the numbers the rule compared."""
    window = profile.window(short_s)
    rate = "{{ .Value | printf \"%.3g\" }}"
    if slo is LATENCY:
        slo_ms = f"{SLO_SECONDS * 1000:g} ms"
        found = (f"{{{{ .Labels.stage }}}} alone took longer than {slo_ms} in {rate} requests/s over {window}, "
                 "more than any other stage")
        fallback = (f"no stage alone took longer than {slo_ms} over {window}; {{{{ .Labels.stage }}}} has the "
                    "highest P99 ({{ .Value | humanizeDuration }})")
        otherwise = (f"{_in_job(slo.fallback_query(profile, short_s))}{fallback}{{{{ else }}}}"
                     f"no stage latency recorded over {window}{{{{ end }}}}")
    else:
        found = f"{{{{ .Labels.stage }}}} failed in {rate} requests/s over {window}, more than any other stage"
        otherwise = f"no pipeline stage failed over {window}: the 5xx answers came from outside the pipeline"
    return f"{_in_job(slo.stage_query(profile, short_s))}{found}{{{{ else }}}}{otherwise}{{{{ end }}}}"


def _duration(seconds: float) -> str:
    return f"{seconds / DAY:.3g} days" if seconds >= 3 * DAY else f"{seconds / HOUR:.3g} hours"


def first_look(slo: Slo, profile: Profile, short_s: int) -> tuple[str, dict[str, str]]:
    """What an alert names to look at first, over its short window: the summary's closing words and the annotations.
    Latency and availability name a stage; quality names the bad verdict that dominates and the similarity's drift."""
    if slo is QUALITY:
        window = profile.window(short_s)
        verdict = quality.verdict_template(window)
        return f"verdict: {verdict}", {"verdict": verdict,
                                       "verdict_evidence": quality.verdict_evidence_template(window),
                                       "drift": quality.drift_template(window)}
    stage = stage_template(slo, profile, short_s)
    # Only a slower tail has a cause to rank (dashboards.why); a 5xx names its failing stage alone.
    names = why_names(profile)
    cause = ({"cause": why.cause_template(names), "cause_evidence": why.cause_evidence_template(names)}
             if slo is LATENCY else {})
    return f"stage: {stage}", {"stage": stage, "stage_evidence": stage_evidence_template(slo, profile, short_s),
                               **cause}


def alert_rule(slo: Slo, alert: BurnAlert, profile: Profile) -> dict:
    """The Prometheus alerting rule of one SLO and one burn-rate alert."""
    long, short = profile.window(alert.long_s), profile.window(alert.short_s)
    threshold = f"({alert.factor:g} * {slo.budget:g})"
    expr = (f'{sli_error_record(long)}{{slo="{slo.name}"}} > {threshold}\n'
            f'and\n{sli_error_record(short)}{{slo="{slo.name}"}} > {threshold}')
    if slo.min_events:  # a ratio of a handful of events (a service's first answers) is noise, not a burn
        expr += f"\nand on ({KEPT})\n{slo.events(short)} >= {slo.min_events}"
    named, annotations = first_look(slo, profile, alert.short_s)
    return {
        "alert": alert_name(slo),
        "expr": expr,
        "labels": {"severity": alert.severity, "slo": slo.name, "burn": alert.speed,
                   "long_window": long, "short_window": short},
        "annotations": {
            "summary": f"{{{{ with $labels.{KEPT} }}}}{{{{ . }}}}: {{{{ end }}}}{slo.title} SLO error budget burning {alert.factor:g}x too fast over {long} and {short}; "
                       f"{named}",
            "description": f"Objective: {slo.objective * 100:g} % of {slo.counted} good over {_duration(SLO_PERIOD_S)} (bad: {slo.what}). "
                           f"At this rate the whole budget is gone in {_duration(SLO_PERIOD_S / alert.factor)}.",
            **annotations,
        },
    }


def prometheus_rules(profile: Profile) -> dict:
    """The rule file: per-stage quantiles, SLI error ratios per window, the causes of a slower tail, burn-rate
    alerts (each group reads only records of the groups above it)."""
    bucket = contract.bucket(contract.STAGE_DURATION)
    quantiles = [{"record": stage_quantile_record(q, profile),
                  "expr": f"histogram_quantile({q:g}, sum by ({KEPT}, le, stage) (rate({bucket}[{profile.window(QUANTILE_WINDOW_S)}])))"}
                 for q in QUANTILES]
    quantiles += [{"record": stage_quantile_record(0.99, profile, w),
                   "expr": f"histogram_quantile(0.99, sum by ({KEPT}, le, stage) (rate({bucket}[{profile.window(w)}])))"}
                  for w in STAGE_P99_WINDOWS_S if w != QUANTILE_WINDOW_S]
    quantiles += [{"record": stage_over_slo_record(profile, w), "expr": stage_over_slo_expr(profile.window(w))}
                  for w in STAGE_P99_WINDOWS_S]
    ratios = [{"record": sli_error_record(profile.window(w)), "expr": slo.error_ratio(profile.window(w)),
               "labels": {"slo": slo.name}}
              for slo in SLOS for w in SLI_WINDOWS_S]
    alerts = [alert_rule(slo, alert, profile) for slo in SLOS for alert in BURN_ALERTS]
    return {"groups": [
        {"name": "ragheat-stage-quantiles", "rules": quantiles},
        {"name": "ragheat-slo-error-ratios", "rules": ratios},
        why.recording_rules(why_names(profile)),
        {"name": "ragheat-slo-burn-alerts", "rules": alerts},
        quality.drift_rules(profile),
    ]}


NOTIFICATION_TEMPLATE = "ragheat.tmpl"
"""Alertmanager's notification templates, written beside its config."""


def notification_template() -> str:
    """``ragheat.title`` and ``ragheat.text`` for a receiver that writes messages (chat, e-mail): the cause first,
    then the stage (a quality alert: the verdict and the drift), the summary and where to read the whole explanation.
    Webhook receivers (the stack's) get the same annotations as JSON."""
    return """{{ define "ragheat.title" }}[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} {{ .CommonLabels.job }}
{{- with .CommonAnnotations.cause }}: cause {{ . }}{{ end }}
{{- with .CommonAnnotations.verdict }}: verdict {{ . }}{{ end }}{{ end }}

{{ define "ragheat.text" }}{{ range .Alerts }}
{{- with .Annotations.cause }}cause: {{ . }}{{ end }}{{ with .Annotations.cause_evidence }}: {{ . }}{{ end }}
{{ if .Annotations.stage }}stage: {{ .Annotations.stage }}: {{ .Annotations.stage_evidence }}
{{ end }}{{ if .Annotations.verdict }}verdict: {{ .Annotations.verdict }}: {{ .Annotations.verdict_evidence }}
drift: {{ .Annotations.drift }}
{{ end }}{{ .Annotations.summary }}
{{ .Annotations.description }}
{{ if .Annotations.cause }}the whole evidence: ragheat explain --prometheus URL --job {{ .Labels.job }} --window 5m
{{ end }}{{ end }}{{ end }}
"""


def alertmanager_config(page_url: str, ticket_url: str, templates_dir: str = "/etc/alertmanager") -> dict:
    """Pages and tickets go to their own receivers, one notification per job and SLO; a page silences the ticket of
    the same job and SLO. The quality alerts take a route of their own to the same receivers: answers without a good
    passage are for whoever owns the corpus and the model, which a deployment names by changing that route's
    receivers alone. ``templates_dir``: where Alertmanager finds NOTIFICATION_TEMPLATE (an absolute path, as the
    stack checks)."""
    def receiver(name: str, url: str) -> dict:
        return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}

    def by_severity() -> list[dict]:  # fresh each time: a shared object would be written as a YAML alias
        return [{"matchers": ['severity="page"'], "receiver": "page", "repeat_interval": "1h"},
                {"matchers": ['severity="ticket"'], "receiver": "ticket", "repeat_interval": "24h"}]

    return {
        "templates": [f"{templates_dir.rstrip('/')}/{NOTIFICATION_TEMPLATE}"],
        "route": {
            "receiver": "ticket", "group_by": ["alertname", KEPT, "slo"],
            "group_wait": "30s", "group_interval": "5m", "repeat_interval": "12h",
            "routes": [
                {"matchers": [f'slo="{QUALITY.name}"'], "receiver": "ticket", "routes": by_severity()},
                *by_severity(),
            ],
        },
        "inhibit_rules": [{"source_matchers": ['severity="page"'], "target_matchers": ['severity="ticket"'],
                           "equal": [KEPT, "slo"]}],
        "receivers": [receiver("page", page_url), receiver("ticket", ticket_url)],
    }
