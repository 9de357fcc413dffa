"""Why the P99 grew, as recording rules: the ranking of ``explain.causes`` in PromQL, per job, so the latency page's
annotations and the SLO board's "Why" panel name the top cause without running ``ragheat explain``.

The rules compare the last 5 minutes with a baseline and charge each stage's P99 growth, in milliseconds, to a cause
(``ragheat:why_cause:score5m{job, cause}``, one series per job and cause of :data:`CAUSES`), as ``explain.causes``
does:

- the ``queue`` stage's growth goes to **overload**;
- a stage whose P99 ratio is ``STANDS_OUT`` times the median of the ordinary stages' has a cause of its own: the
  language model or the graph store for the stages that wait on them, else the stage itself;
- the other stages' growth is split among the machine-wide sources by the CPU cores each took beyond the baseline
  (a neighbour, the service's own process at the same load, the extra load, stall time on memory or I/O); on a
  host already busy a neighbour is its tasks' extra wait for a CPU, and while memory stalls grow the host's extra
  kernel CPU (reclaim) is memory's; with none, each of those stages is its own cause too.

Where PromQL cannot follow ``ragheat explain`` the rules approximate it (the docs list each approximation):

- The baseline is the median of the 5-minute values recorded over the hour before, not one hour-long
  aggregation: when a page fires the fault is already minutes old, and a P99 over an hour that holds a few of
  those minutes is the fault's own; a median of 5-minute values is not, until the fault fills half the hour.
- "Is anything wrong?" reads the window's P97 against the baseline's P99 (at least 3 % of the window's requests
  were slower) instead of counting requests above the baseline's P99 bucket; it does not ask for three such
  requests, nor count more shedding or fallbacks without a slower P99 (those causes carry no milliseconds).
- The kernel probes' split of a stage's own cause into a lock, the disk or the network is left to ``ragheat
  explain``: here it stays ``stage``.

The thresholds are ``explain.causes``'s, written again here (dashboards sits below explain, which reads Prometheus
through it); a test keeps the two equal.
"""

from __future__ import annotations

from dashboards import contract
from dashboards.spec import JOB as KEPT
from rag.stages import SLOWED_BY_DEPENDENCY, WAIT_STAGES

WINDOW_S = 5 * 60
BASELINE_S = 60 * 60
QUANTILE = 0.99
NOISE_MS = 10.0
NOISE_SHARE = 0.3
CORE_NOISE = 0.25
PRESSURE_NOISE = 0.05
TAIL_SHARE = 0.03
STANDS_OUT = 2.0
LOAD_GROWTH = 1.25
MACHINE_CAUSES = ("overload", "cpu_neighbour", "cpu_in_process", "memory", "io")
"""Machine-wide sources, in ``explain.causes._machine_weights``'s order."""
DEPENDENCIES = tuple(dict.fromkeys(SLOWED_BY_DEPENDENCY.values()))
"""The dependencies a stage's growth is charged to (rag.stages, as explain reads them), in the stage table's order."""
OWN_CAUSES = (*DEPENDENCIES, "stage")
"""The cause of a stage that slowed on its own: its dependency, or the stage itself."""
CAUSES = MACHINE_CAUSES + OWN_CAUSES
"""Every ``cause`` label value of the score: a closed set, names of ``explain.causes.Kind``."""
STALLS = ("memory", "io")
"""The pressure stall resources that are causes (CPU pressure is a neighbour's or the load's symptom)."""


def _alternation(names) -> str:
    return "|".join(sorted(names))


WAITING = _alternation(WAIT_STAGES)
DEPENDENT = _alternation(SLOWED_BY_DEPENDENCY)
STAGES_OF = {cause: _alternation(s for s, c in SLOWED_BY_DEPENDENCY.items() if c == cause) for cause in DEPENDENCIES}


class Names:
    """The record names for a window and a baseline (Prometheus durations: a profile's ``5m`` and ``1h``), each
    saying its window or that it is the baseline."""

    def __init__(self, window: str, baseline: str) -> None:
        self.window, self.baseline = window, baseline

    def now(self, signal: str) -> str:
        return f"ragheat:why_{signal}:{self.window}"

    def before(self, signal: str) -> str:
        return f"ragheat:why_{signal}:baseline{self.baseline}"

    @property
    def score(self) -> str:
        return f"ragheat:why_cause:score{self.window}"

    @property
    def charge(self) -> str:
        return self.now("charge_ms")


SIGNALS = {
    "answered_per_s": f'sum by ({KEPT}) (rate({contract.count(contract.REQUEST_DURATION)}{{outcome="ok"}}[{{w}}]))',
    "p99_ms": (f"1e3 * histogram_quantile({QUANTILE:g}, sum by ({KEPT}, le) "
               f'(rate({contract.bucket(contract.REQUEST_DURATION)}{{outcome="ok"}}[{{w}}]))) >= 0'),
    "stage_p99_ms": (f"1e3 * histogram_quantile({QUANTILE:g}, sum by ({KEPT}, le, stage) "
                     f'(rate({contract.bucket(contract.STAGE_DURATION)}{{outcome="ok"}}[{{w}}]))) >= 0'),
    "process_cores": f"sum by ({KEPT}) (rate({contract.HOST['process_cpu']}[{{w}}]))",
    # One service may run several processes on one host: the host is counted once, as explain.signals does.
    "others_cores": (f"max by ({KEPT}) (sum by ({KEPT}, instance) "
                     f'(rate({contract.HOST["host_cpu"]}{{mode!~"idle|iowait|steal"}}[{{w}}])))\n'
                     f"- sum by ({KEPT}) (rate({contract.HOST['process_cpu']}[{{w}}]))"),
    # The kernel's CPU time on the host: while memory stalls grow, the part of it outside the service is reclaim.
    "host_system_cores": (f"max by ({KEPT}) (sum by ({KEPT}, instance) "
                          f'(rate({contract.HOST["host_cpu"]}{{mode="system"}}[{{w}}])))'),
    # CPU too: on a host already busy a neighbour shows as its tasks waiting longer for a CPU.
    "stalled_share": (f"max by ({KEPT}, resource) (rate({contract.HOST['pressure']}"
                      f'{{scope="some", resource=~"{_alternation((*STALLS, "cpu"))}"}}[{{w}}]))'),
}
"""Each signal over the window, per job (``{w}``: the window); the baseline is the median of these records over the
hour before."""


def _signal_rules(names: Names) -> list[dict]:
    rules = []
    for signal, template in SIGNALS.items():
        rules.append({"record": names.now(signal), "expr": template.replace("{w}", names.window)})
    answered, shed = names.now("answered_per_s"), contract.SHED
    # Offered load is answered plus shed; a service without admission control has no shed series: zero then.
    rules.append({"record": names.now("offered_per_s"),
                  "expr": f"{answered} + on ({KEPT}) (sum by ({KEPT}) (rate({shed}[{names.window}])) or 0 * {answered})"})
    rules.append({"record": names.now("p97_ms"),
                  "expr": SIGNALS["p99_ms"].replace(f"{QUANTILE:g}", f"{1 - TAIL_SHARE:g}", 1)
                  .replace("{w}", names.window)})
    rules.append({"record": names.now("host_cores"),
                  "expr": f"max by ({KEPT}) (sum by ({KEPT}, instance) "
                          f"(rate({contract.HOST['host_cpu']}[{names.window}])))"})
    for signal in (*SIGNALS, "offered_per_s"):
        # A recorded value every evaluation: the median of the hour's 5-minute values, ending where the window starts.
        rules.append({"record": names.before(signal),
                      "expr": f"quantile_over_time(0.5, {names.now(signal)}[{names.baseline}] offset {names.window})"})
    return rules


def _stage_rules(names: Names) -> list[dict]:
    """Each stage's growth and ratio, and which stages slowed on their own."""
    now, before = names.now("stage_p99_ms"), names.before("stage_p99_ms")
    growth, ratio = names.now("stage_growth_ms"), names.now("stage_ratio")
    median = names.now("ordinary_ratio_median")
    alone, shared = names.now("stage_alone_ms"), names.now("stage_shared_ms")
    return [
        # A stage the baseline never ran grew by all of its P99, by an infinite ratio.
        {"record": growth, "expr": f"clamp_min({now} - {before}, 0) or {now}"},
        {"record": ratio, "expr": f"{now} / {before} or {now} * 0 + Inf"},
        {"record": median,
         "expr": f'clamp_min(quantile by ({KEPT}) (0.5, ({ratio}{{stage!~"{WAITING}|{DEPENDENT}"}} < Inf)\n'
                 f"  and on ({KEPT}, stage) ({growth} > 0)), 1)\n"
                 f"or on ({KEPT}) (0 * {names.now('answered_per_s')} + 1)"},
        {"record": alone,
         "expr": f'{growth}{{stage!~"{WAITING}"}} >= {NOISE_MS / 2:g}\n'
                 f"and on ({KEPT}, stage) ({ratio} >= on ({KEPT}) group_left () ({STANDS_OUT:g} * {median}))"},
        {"record": shared, "expr": f'{growth}{{stage!~"{WAITING}"}} > 0 unless on ({KEPT}, stage) {alone}'},
    ]


def _stalled_more(names: Names, resource: str) -> str:
    """How much more of the time the host's tasks stalled on ``resource`` than in the baseline, per job."""
    return (f'max by ({KEPT}) ({names.now("stalled_share")}{{resource="{resource}"}}\n'
            f'  - {names.before("stalled_share")}{{resource="{resource}"}})')


def _core_rules(names: Names) -> list[dict]:
    """Cores each machine-wide source took beyond the baseline, where it moved beyond noise (``cause`` label)."""
    now, before = names.now, names.before
    load, reclaim = now("load_cores"), now("reclaim_cores")
    cores = now("cores_beyond")
    others = f"({now('others_cores')} - {before('others_cores')})"
    more_load = f"({now('offered_per_s')} / {before('offered_per_s')} >= {LOAD_GROWTH:g})"
    own = f"{now('process_cores')} - {before('process_cores')} - {load} >= {CORE_NOISE:g}"
    neighbour = f"{others} - ({reclaim} or on ({KEPT}) 0 * {others}) >= {CORE_NOISE:g}"
    by_cause = {
        "overload": f"clamp_min({load}, {CORE_NOISE:g})\nand on ({KEPT}) {more_load}",
        # A host already busy cannot get busier, but its tasks wait longer for a CPU: at the same load and with the
        # service burning no more, the extra wait is someone else's.
        "cpu_neighbour": f"{neighbour}\nor on ({KEPT}) ({_stalled_more(names, 'cpu')} >= {PRESSURE_NOISE:g})\n"
                         f"* on ({KEPT}) {now('host_cores')}\n"
                         f"unless on ({KEPT}) {more_load} unless on ({KEPT}) ({own})",
        "cpu_in_process": own,
        **{resource: f"({_stalled_more(names, resource)} >= {PRESSURE_NOISE:g})\n* on ({KEPT}) {now('host_cores')}"
           for resource in STALLS},
    }
    # The reclaim is the memory's: stall time on memory plus the kernel CPU reclaiming it.
    by_cause["memory"] = f"{by_cause['memory']}\n+ on ({KEPT}) ({reclaim} or on ({KEPT}) 0 * {now('host_cores')})"
    rules = [
        # The cores the extra load itself costs, at the baseline's CPU per answered request.
        {"record": load, "expr": f"{before('process_cores')} / {before('answered_per_s')}\n"
                                 f"* clamp_min({now('answered_per_s')} - {before('answered_per_s')}, 0)"},
        # While memory stalls grow, the host's extra kernel CPU outside the service is reclaim (kswapd), not a
        # neighbour's work: at most what the rest of the host took beyond the baseline.
        {"record": reclaim,
         "expr": f"((clamp_min({now('host_system_cores')} - {before('host_system_cores')}, 0) <= on ({KEPT}) "
                 f"clamp_min({others}, 0))\n or on ({KEPT}) clamp_min({others}, 0))\n"
                 f"and on ({KEPT}) ({_stalled_more(names, 'memory')} >= {PRESSURE_NOISE:g})"},
    ]
    rules += [{"record": cores, "expr": by_cause[cause], "labels": {"cause": cause}} for cause in MACHINE_CAUSES]
    rules.append({"record": now("cores_beyond_total"), "expr": f"sum by ({KEPT}) ({cores})"})
    return rules


def _charge_rules(names: Names) -> list[dict]:
    """Milliseconds of each stage's growth charged to each cause (``job``, ``stage``, ``cause``): one rule per cause,
    each over its own stages."""
    growth, alone, shared = names.now("stage_growth_ms"), names.now("stage_alone_ms"), names.now("stage_shared_ms")
    cores, total = names.now("cores_beyond"), names.now("cores_beyond_total")
    # Queue time is waiting for a worker: overload's, whatever the machine-wide sources.
    queued = f'{growth}{{stage=~"{WAITING}"}} > 0\nor '
    rules = [{"record": names.charge,
              "expr": (queued if cause == "overload" else "")
              + f'{shared} * on ({KEPT}) group_left () ({cores}{{cause="{cause}"}} / on ({KEPT}) {total})',
              "labels": {"cause": cause}} for cause in MACHINE_CAUSES]
    # With no machine-wide signal, a stage that slowed with others is its own cause too.
    for cause in OWN_CAUSES:
        matcher = f'stage=~"{STAGES_OF[cause]}"' if cause in STAGES_OF else f'stage!~"{DEPENDENT}"'
        rules.append({"record": names.charge,
                      "expr": f"{alone}{{{matcher}}} or ({shared}{{{matcher}}} unless on ({KEPT}) {total})",
                      "labels": {"cause": cause}})
    return rules


def _score_rules(names: Names) -> list[dict]:
    """Whether the P99 grew beyond noise, and each cause's milliseconds (zero while it did not)."""
    growth, p99_before = names.now("p99_growth_ms"), names.before("p99_ms")
    slower = names.now("slower")
    zero = f"0 * {names.now('answered_per_s')}"
    rules = [
        {"record": growth, "expr": f"{names.now('p99_ms')} - {p99_before}"},
        {"record": slower,
         "expr": f"{growth} > {NOISE_MS:g} and {growth} > {NOISE_SHARE:g} * {p99_before}\n"
                 f"and on ({KEPT}) ({names.now('p97_ms')} > {p99_before})"},
    ]
    rules += [{"record": names.score,
               "expr": f'(sum by ({KEPT}) ({names.charge}{{cause="{cause}"}}) and on ({KEPT}) {slower})\n'
                       f"or on ({KEPT}) {zero}",
               "labels": {"cause": cause}} for cause in CAUSES]
    return rules


def recording_rules(names: Names) -> dict:
    """The rule group, in evaluation order: each rule reads only records above it."""
    rules = _signal_rules(names) + _stage_rules(names) + _core_rules(names) + _charge_rules(names) + _score_rules(names)
    return {"name": "ragheat-why", "rules": rules}


# --- the latency page's annotations ----------------------------------------------------------------------------
# Go templates Prometheus runs at each evaluation of the alert: queries of the records above for the alert's own job,
# so the cause named follows the fault while the alert keeps one identity.

def _each(query_format: str, *args: str) -> str:
    """A template action header ranging over ``query_format`` (a ``printf`` format) run for ``args``."""
    return f'{{{{ range query (printf "{query_format}" {" ".join(args)}) }}}}'


def _number(record: str, matchers: str, args: tuple[str, ...], shown: str) -> str:
    """``record``'s value in the alert's job (``matchers``, a ``printf`` format, with ``args``), as ``shown``
    formats it; ``n/a`` when there is none."""
    return f"{_each(f'{record}{{{matchers}}}', *args)}{{{{ .Value | {shown} }}}}{{{{ else }}}}n/a{{{{ end }}}}"


_IN_JOB = (f"{KEPT}=%q", (f"$labels.{KEPT}",))
_DECIMALS = {1: 'printf "%.1f"', 2: 'printf "%.2f"', 0: 'printf "%.0f"'}


def _then(names: Names, signal: str, shown: str, matchers: str = _IN_JOB[0],
          args: tuple[str, ...] = _IN_JOB[1]) -> str:
    """``signal`` now, "against" its baseline."""
    return (f"{_number(names.now(signal), matchers, args, shown)} against "
            f"{_number(names.before(signal), matchers, args, shown)}")


def _cause_detail(names: Names) -> dict[str, str]:
    """Per machine-wide cause, the signal that moved (the stage-bound causes say it with their stage's P99)."""
    one, two, share = _DECIMALS[1], _DECIMALS[2], "humanizePercentage"
    offered = f"{_then(names, 'offered_per_s', one)} req/s offered"
    stalled = {resource: _then(names, "stalled_share", share, f"{KEPT}=%q, resource=%q",
                               (f"$labels.{KEPT}", f'"{resource}"')) for resource in STALLS}
    return {
        "overload": f"; {offered}",
        "cpu_neighbour": f"; other processes on the host busy {_then(names, 'others_cores', two)} cores",
        "cpu_in_process": f"; the service's process {_then(names, 'process_cores', two)} cores at {offered}",
        "memory": f"; tasks stalled on memory {stalled['memory']} of the time",
        "io": f"; tasks stalled on I/O {stalled['io']} of the time",
    }


def _top_cause(names: Names) -> str:
    return _each(f"topk(1, {names.score}{{{KEPT}=%q}} > 0)", f"$labels.{KEPT}")


def cause_template(names: Names) -> str:
    """Annotation text: the cause with the most milliseconds of stage P99 growth, or ``none``."""
    return f"{_top_cause(names)}{{{{ .Labels.cause }}}}{{{{ else }}}}none{{{{ end }}}}"


def cause_evidence_template(names: Names) -> str:
    """Annotation sentence: the top cause's milliseconds, the stage it was most charged from (P99 then and now) and
    the signal that moved."""
    stage_matchers, stage_args = f"{KEPT}=%q, stage=%q", (f"$labels.{KEPT}", "$stage")
    stage = (f'{_each(f"topk(1, {names.charge}{{{KEPT}=%q, cause=%q}})", f"$labels.{KEPT}", "$cause")}'
             "{{ $stage := .Labels.stage }}, most in {{ $stage }} (P99 "
             f"{_number(names.before('stage_p99_ms'), stage_matchers, stage_args, _DECIMALS[0])} -> "
             f"{_number(names.now('stage_p99_ms'), stage_matchers, stage_args, _DECIMALS[0])} ms){{{{ end }}}}")
    details = _cause_detail(names)
    detail = "".join(f'{{{{ {"if" if i == 0 else "else if"} eq $cause "{cause}" }}}}{text}'
                     for i, (cause, text) in enumerate(details.items())) + "{{ end }}"
    found = ("{{ $cause := .Labels.cause }}"
             f"{{{{ .Value | printf \"%.0f\" }}}} ms of stage P99 growth over {names.window} against the "
             f"{names.baseline} before{stage}{detail}")
    nothing = (f"no cause: the P99 over {names.window} did not grow beyond noise against the {names.baseline} "
               "before (ragheat explain has the full evidence)")
    return f"{_top_cause(names)}{found}{{{{ else }}}}{nothing}{{{{ end }}}}"
