"""The four boards: RAG latency, SLO, vLLM, Kernel. Metric names come from ``dashboards.contract``,
window names and recording rules from ``dashboards.slo`` (so a profile renames both together)."""

from __future__ import annotations

from dashboards import contract
from dashboards.slo import (BURN_ALERTS, QUANTILE_WINDOW_S, SLI_WINDOWS_S, SLO_PERIOD_S, SLOS, Profile,
                            sli_error_record, stage_quantile_record)
from dashboards.spec import RATE_INTERVAL, Board, Panel, Query, Variable
from rag.slo import SLO_SECONDS


def _rate(series: str, selector: str = "") -> str:
    return f"rate({series}{{{selector}}}[{RATE_INTERVAL}])" if selector else f"rate({series}[{RATE_INTERVAL}])"


def _heatmap(title: str, family: str, selector: str = "", **options) -> Panel:
    """Buckets per le, ready for Grafana's heatmap (format ``heatmap``, one series per ``le``)."""
    query = Query(f"sum by (le) ({_rate(contract.bucket(family), selector)})", "{{le}}", (family,))
    return Panel(title, "heatmap", (query,), log_y=True, **options)


def latency_board(profile: Profile) -> Board:
    """RAG latency: per-stage heatmaps, end-to-end percentiles, load, errors."""
    stage, request = contract.STAGE_DURATION, contract.REQUEST_DURATION
    load = 'qps_bucket=~"$qps_bucket"'
    answered = f'outcome="ok", {load}'
    selected_stage = 'stage=~"$stage"'
    quantiles = tuple(
        Query(f"histogram_quantile({q:g}, sum by (le) ({_rate(contract.bucket(request), answered)}))",
              f"P{round(q * 100)}", (request,))
        for q in (0.5, 0.95, 0.99))
    panels = (
        _heatmap("Stage latency: $stage", stage, f"{selected_stage}, {load}", repeat="stage", width=8,
                 exemplars=True, thresholds=(SLO_SECONDS,),
                 description="Requests per second in each latency bucket of one pipeline stage (rows are the "
                             "buckets of telemetry.buckets). Exemplars link cells to the traces that landed there."),
        Panel("End-to-end latency P50 / P95 / P99", "timeseries", quantiles, thresholds=(SLO_SECONDS,), exemplars=True,
              description=f"Answered requests, as the server saw them; the line is the {SLO_SECONDS * 1000:g} ms objective."),
        _heatmap("End-to-end latency", request, answered, exemplars=True, thresholds=(SLO_SECONDS,)),
        Panel(f"P99 by stage (recorded, {profile.window(QUANTILE_WINDOW_S)})", "timeseries",
              (Query(f"{stage_quantile_record(0.99, profile)}{{{selected_stage}}}", "{{stage}}", (stage,)),),
              log_y=True),
        Panel("Request rate", "timeseries",
              (Query(f"sum by (status_class) ({_rate(contract.REQUESTS)})", "{{status_class}}", (contract.REQUESTS,)),
               Query(f"sum({contract.QPS})", "service qps window", (contract.QPS,))), unit="reqps"),
        Panel("Errors by stage", "timeseries",
              (Query(f"sum by (stage) ({_rate(contract.STAGE_ERRORS, selected_stage)})", "{{stage}}",
                     (contract.STAGE_ERRORS,)),), unit="reqps"),
        Panel("Requests in flight", "timeseries",
              (Query(f"sum by (route) ({contract.IN_FLIGHT})", "{{route}}", (contract.IN_FLIGHT,)),), unit="short"),
    )
    variables = (Variable("stage", contract.bucket(stage), "stage"),
                 Variable("qps_bucket", contract.bucket(stage), "qps_bucket"))
    return Board("ragheat-latency", "RAG latency", "Per-stage latency heatmaps, end-to-end percentiles, load and errors.",
                 panels, variables)


def slo_board(profile: Profile) -> Board:
    """SLO: each objective's SLI, remaining error budget and burn rates."""
    panels: list[Panel] = []
    short = profile.window(min(SLI_WINDOWS_S))
    period = profile.window(SLO_PERIOD_S)
    for slo in SLOS:
        sources = (contract.REQUEST_DURATION,) if slo.name == "latency" else (contract.REQUESTS,)
        selector = f'{{slo="{slo.name}"}}'
        panels += [
            Panel(f"{slo.title} SLI ({short})", "timeseries",
                  (Query(f"1 - {sli_error_record(short)}{selector}", "good share", sources),),
                  unit="percentunit", thresholds=(slo.objective,), width=8,
                  description=f"Share of requests that are good; bad = {slo.what}."),
            Panel(f"{slo.title} error budget remaining ({period})", "stat",
                  (Query(f"1 - {sli_error_record(period)}{selector} / {slo.budget:g}", "remaining", sources),),
                  unit="percentunit", width=8,
                  description=f"1 - (bad share over {period}) / (1 - {slo.objective:g}); below 0 the SLO is missed."),
            Panel(f"{slo.title} burn rate per window", "timeseries",
                  tuple(Query(f"{sli_error_record(profile.window(w))}{selector} / {slo.budget:g}", profile.window(w),
                              sources) for w in SLI_WINDOWS_S),
                  unit="short", thresholds=tuple(sorted({a.factor for a in BURN_ALERTS})), width=8,
                  description="1 = spending the budget exactly over the period; the lines are the alert factors."),
        ]
    return Board("ragheat-slo", "SLO", f"Latency and availability objectives, budgets and burn rates ({profile.name} windows).",
                 tuple(panels))


def vllm_board(profile: Profile) -> Board:
    """vLLM: TTFT and inter-token latency (engine and client side), KV cache, queueing, preemptions."""
    native, ours, client = contract.VLLM_NATIVE, contract.VLLM, contract.GENERATION

    def gauge(title: str, unit: str, *pairs: tuple[str, str]) -> Panel:
        return Panel(title, "timeseries", tuple(Query(f"sum({name})", legend, (name,)) for name, legend in pairs),
                     unit=unit, width=8)

    panels = (
        _heatmap("Time to first token (vLLM engine)", native["ttft"]),
        _heatmap("Time to first token (ragheat client)", client["ttft"]),
        _heatmap("Inter-token latency (vLLM engine)", native["inter_token"]),
        _heatmap("Inter-token latency (ragheat client)", client["inter_token"]),
        gauge("KV-cache usage", "percentunit", (native["kv_usage"], "vLLM"), (ours["kv_usage"], "ragheat plugin")),
        gauge("Running / waiting requests", "short", (native["running"], "running"), (native["waiting"], "waiting")),
        Panel("Preemptions", "timeseries",
              (Query(f"sum({_rate(native['preemptions'])})", "vLLM", (native["preemptions"],)),
               Query(f"sum({_rate(ours['preemptions'])})", "ragheat plugin", (ours["preemptions"],))),
              unit="ops", width=8),
        _heatmap("Engine step duration: $phase", ours["step_duration"], 'phase=~"$phase"', repeat="phase", width=8),
    )
    variables = (Variable("phase", contract.bucket(ours["step_duration"]), "phase"),)
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
    variables = (Variable("stage", contract.bucket(k["runqueue"]), "stage"),
                 Variable("reason", contract.bucket(k["offcpu"]), "reason"),
                 Variable("family", contract.bucket(k["syscall"]), "family"))
    return Board("ragheat-kernel", "Kernel", "Scheduler and system-call time attributed to RAG stages by eBPF probes.",
                 panels, variables)


def all_boards(profile: Profile) -> tuple[Board, ...]:
    """Every board for ``profile``, in display order."""
    return tuple(build(profile) for build in (latency_board, slo_board, vllm_board, kernel_board))
