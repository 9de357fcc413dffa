"""docs/benchmarks.md is reproduced, not copied: rendered byte for byte from benchmarks/doc_template.md and the
committed results files (benchmarks/render_docs.py), with every required section measured. The renderer itself and
its honest-statistics helpers are tested on small fixtures, so a renderer bug cannot hide behind a doc that was
rendered by the same bug."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.docgen import stats
from benchmarks.docgen.capacity import probes
from benchmarks.docgen.quality import fusion
from benchmarks.docgen.render import RenderError, Section, render, wrap_command
from benchmarks.docgen.sections import SECTIONS, STEPS
from loadgen.resultsfile import BenchmarkRun

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def rendered_from_committed_results():
    return render((REPO / "benchmarks" / "doc_template.md").read_text(encoding="utf-8"), SECTIONS, RESULTS, STEPS)


def test_every_required_section_has_its_results_files():
    missing = rendered_from_committed_results().missing_required
    assert not missing, "required sections without results (measure them on a quiet machine, then render):\n" + "\n".join(
        f"  {name}: {', '.join(f'benchmarks/results/{f}.json' for f in files)} -> bash benchmarks/run_all.sh "
        + " ".join(dict.fromkeys(STEPS[f] for f in files)) for name, files in missing.items())


def test_the_doc_is_its_rendering_byte_for_byte():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "render_docs.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    if "differs from its rendering" in done.stderr:
        pytest.fail("docs/benchmarks.md is not what its results files render (edit benchmarks/doc_template.md, not "
                    "the doc; then .venv/bin/python benchmarks/render_docs.py):\n" + done.stdout[:4000])
    assert "render_docs:" not in done.stderr, done.stderr


def test_every_results_file_the_sections_read_has_a_run_all_step():
    steps = subprocess.run(["bash", str(REPO / "benchmarks" / "run_all.sh"), "--list"], capture_output=True,
                           text=True, check=True, timeout=30).stdout.split()
    files = {f for section in SECTIONS for f in section.files}
    assert set(STEPS) == files
    assert {STEPS[f] for f in files} <= set(steps)


def committed_documents() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in sorted(RESULTS.glob("*.json"))}


def test_each_measured_section_names_its_command_and_provenance():
    doc = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    bash_blocks = "\n".join(block.split("```", 1)[0] for block in doc.split("```bash\n")[1:])
    documents = committed_documents()
    assert documents, "no committed results files under benchmarks/results/"
    for section in SECTIONS:
        for name in section.files:
            if name not in documents:
                continue
            assert wrap_command(documents[name]["command"]) in bash_blocks, f"{name}: its command is not shown"
            assert f"*`benchmarks/results/{name}.json`: " in doc, f"{name}: no provenance line"
            assert documents[name]["git"]["commit"][:7] in doc


# Numbers the template's own prose may hold: settings, thresholds, buckets and cited published figures. None is a
# measurement of ours; a measured figure belongs in a results file and reaches the doc through a {{ key }}.
TEMPLATE_NUMBERS = {"0", "0.5", "0.645", "0.686", "0.717", "0.99", "0.999", "1", "1,521", "1,842", "1.5", "10", "100",
                    "117", "128", "16", "2", "2,105", "20", "32", "384", "4096", "48", "512", "60", "63", "64", "768",
                    "8", "95"}


def test_the_template_prose_holds_no_measured_figure():
    text = re.sub(r"\{\{ [^}]+ \}\}", "", (REPO / "benchmarks" / "doc_template.md").read_text(encoding="utf-8"))
    numbers = {n.rstrip(",") for n in re.findall(r"(?<![\w.])\d[\d,]*(?:\.\d+)?", text)}
    assert numbers - TEMPLATE_NUMBERS == set(), "figures in the template's prose: render them from a results file"


def _scaled(value, factor):
    if isinstance(value, float):
        return value * factor
    if isinstance(value, dict):
        return {k: _scaled(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [_scaled(v, factor) for v in value]
    return value


def test_every_figure_of_a_section_comes_from_its_results_files(tmp_path):
    """Scale every measured value in one section's results files: the section's text must change, so none of its
    figures is fixed in the template or the builder."""
    template = (REPO / "benchmarks" / "doc_template.md").read_text(encoding="utf-8")
    documents = committed_documents()
    checked = []
    for section in SECTIONS:
        if section.build is None or not all(f in documents for f in section.files):
            continue
        body = re.search(r"^\{% section " + re.escape(section.name) + r" %\}\n.*?^\{% end %\}\n", template,
                         re.S | re.M).group(0)
        folder = tmp_path / section.name
        folder.mkdir()
        for name in section.files:
            (folder / f"{name}.json").write_text(json.dumps(documents[name]))
        before = render(body, [section], folder, STEPS).text
        for name in section.files:
            (folder / f"{name}.json").write_text(json.dumps({**documents[name],
                                                             "data": _scaled(documents[name]["data"], 1.37)}))
        after = render(body, [section], folder, STEPS).text
        assert before != after, f"section {section.name}: no figure moved when its results did"
        checked.append(section.name)
    assert {s.name for s in SECTIONS if s.required} <= set(checked)


def test_render_docs_fails_clearly_on_a_missing_or_malformed_results_file(tmp_path):
    for name, documents in committed_documents().items():
        (tmp_path / f"{name}.json").write_text(json.dumps(documents))
    script = [sys.executable, str(REPO / "benchmarks" / "render_docs.py"), "--results", str(tmp_path), "--out",
              str(tmp_path / "doc.md")]
    done = subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "doc.md").read_text() == (REPO / "docs" / "benchmarks.md").read_text()
    (tmp_path / "query.json").write_text('{"schema": "ragheat-benchmark-results/1", "data": ')
    done = subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and "query.json: not a readable JSON results file" in done.stderr, done.stderr
    (tmp_path / "query.json").unlink()
    done = subprocess.run(script, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1
    assert "required section 'query' has no results: query.json (bash benchmarks/run_all.sh query)" in done.stderr
    assert "**Not yet measured.** `benchmarks/results/query.json` is missing" in (tmp_path / "doc.md").read_text()


# --- the renderer on a fixture ---------------------------------------------------------------------------------

TEMPLATE = """# Title

{{ machines }}

{% section speed %}
## Speed

{{ provenance }}

```bash
{{ command }}
```

Fast: {{ fast }}.
{% end %}

{% section later %}
## Later

{{ tables }}
{% end %}

{{ results_index }}
"""


def write(results: Path, name: str, data, argv=(".venv/bin/python", "benchmarks/bench_speed.py", "--rounds", "3")):
    run = BenchmarkRun(name, argv=list(argv), environ={"RAGHEAT_INDEX__KIND": "flat", "HOME": "/root"})
    return run.write(data, results / f"{name}.json")


def fixture_sections():
    def speed(results):
        rounds = results["speed"]["rounds_ms"]
        return {"fast": stats.with_range(rounds)}
    return (Section("speed", ("speed",), speed, required=True), Section("later", ("later",), None, required=False))


def test_a_section_renders_its_results_and_a_missing_one_says_so(tmp_path):
    write(tmp_path, "speed", {"rounds_ms": [3.0, 1.0, 2.0]})
    out = render(TEMPLATE, fixture_sections(), tmp_path, {"speed": "speed", "later": "later"})
    doc = json.loads((tmp_path / "speed.json").read_text())
    assert out.measured == ["speed"] and out.missing == {"later": ["later"]} and not out.missing_required
    assert "Fast: 2.00 (1.00–3.00)." in out.text
    assert ("RAGHEAT_INDEX__KIND=flat .venv/bin/python benchmarks/bench_speed.py --rounds 3" in out.text
            and "HOME" not in out.text)
    assert f"commit {doc['git']['commit'][:7]}" in out.text and "machine A" in out.text
    assert "- **Machine A**: " in out.text and doc["machine"]["cpu_model"] in out.text
    # the slot renders its heading and a visible line naming the file and the step that makes it
    assert ("## Later\n\n> **Not yet measured.** `benchmarks/results/later.json` is missing; "
            "`bash benchmarks/run_all.sh later` measures it.\n") in out.text
    assert "{{" not in out.text and "{%" not in out.text
    # a required section without results is reported as such
    (tmp_path / "speed.json").unlink()
    assert render(TEMPLATE, fixture_sections(), tmp_path, {}).missing_required == {"speed": ["speed"]}


def test_a_slot_renders_the_tables_its_results_file_carries(tmp_path):
    write(tmp_path, "speed", {"rounds_ms": [1.0]})
    write(tmp_path, "later", {"doc_tables": [{"title": "Later things", "columns": ["a", "b"], "rows": [[1, "x"]],
                                               "align": "lr"}]})
    text = render(TEMPLATE, fixture_sections(), tmp_path, {}).text
    assert "## Later\n\nLater things\n\n| a | b |\n|---|---:|\n| 1 | x |\n" in text
    write(tmp_path, "later", {"something": 1})
    with pytest.raises(RenderError, match="no builder"):
        render(TEMPLATE, fixture_sections(), tmp_path, {})


def test_the_renderer_refuses_what_it_cannot_render_exactly(tmp_path):
    write(tmp_path, "speed", {"rounds_ms": [1.0]})
    sections = fixture_sections()
    with pytest.raises(RenderError, match="no value for {{ slow }}"):
        render(TEMPLATE.replace("{{ fast }}", "{{ slow }}"), sections, tmp_path, {})
    with pytest.raises(RenderError, match="lacks the registered sections later"):
        render(TEMPLATE.split("{% section later %}")[0], sections, tmp_path, {})
    with pytest.raises(RenderError, match="no section 'other'"):
        render(TEMPLATE + "{% section other %}\n{% end %}\n", sections, tmp_path, {})
    with pytest.raises(RenderError, match="do not have what it renders"):
        write(tmp_path, "speed", {"rounds": [1.0]})
        render(TEMPLATE, sections, tmp_path, {})
    (tmp_path / "speed.json").write_text(json.dumps({"data": {}}))
    with pytest.raises(RenderError, match="not a ragheat-benchmark-results"):
        render(TEMPLATE, sections, tmp_path, {})


def test_the_rendering_is_deterministic_and_check_mode_shows_a_diff(tmp_path):
    write(tmp_path, "speed", {"rounds_ms": [1.0, 2.0]})
    template = tmp_path / "template.md"
    template.write_text(TEMPLATE)
    first = render(TEMPLATE, fixture_sections(), tmp_path, {}).text
    assert render(TEMPLATE, fixture_sections(), tmp_path, {}).text == first
    assert wrap_command("a " + "b" * 120 + " c") == "a \\\n    " + "b" * 120 + " \\\n    c"


# --- honest statistics ---------------------------------------------------------------------------------------

def test_noise_verdict_says_when_the_rounds_do_not_support_the_effect():
    # rounds disagree on the sign: only a bound can be read
    text = stats.noise_verdict([0.6, -3.1, 4.2, 1.0], "Loss")
    assert "disagree on its sign" in text and "−3.1 %" in text and "4.2 %" in text and "smaller than about 4.2 %" in text
    # all positive, but the spread is larger than the effect
    text = stats.noise_verdict([0.2, 1.1, 3.5], "Loss")
    assert "median 1.1 %" in text and "larger than the effect" in text
    # a steady effect
    assert stats.noise_verdict([5.4, 5.7, 5.5], "Loss") == \
        "Loss: 5.5 % (every one of the 3 rounds between 5.4 % and 5.7 %)."
    assert "only round" in stats.noise_verdict([1.0], "Loss")


def test_paired_difference_separates_a_real_gap_from_noise():
    a = {str(i): 0.5 + 0.01 * (i % 3) for i in range(100)}
    shifted = {k: v + 0.02 for k, v in a.items()}
    noisy = {k: v + (0.3 if int(k) % 2 else -0.29) for k, v in a.items()}
    assert stats.paired_difference(shifted, a)["significant"]
    assert not stats.paired_difference(noisy, a)["significant"]
    assert "no difference this data can show" in stats.difference_verdict(stats.paired_difference(noisy, a), "x", "y")


def test_number_formatting():
    assert stats.num(-1234.5, 1) == "−1,234.5" and stats.signed(0.19) == "+0.19" and stats.signed(-0.001) == "+0.00"
    assert stats.duration(160.8) == "2 min 41 s" and stats.duration(48.24) == "48.2 s"
    assert stats.times(7.0, 3.5) == "2.0× faster" and stats.times(3.0, 4.5) == "1.5× slower"
    assert stats.with_range([2.0, 1.0, 3.0]) == "2.00 (1.00–3.00)" and stats.with_range([2.0]) == "2.00"
    assert stats.losses_pct([99.0, 95.0], [100.0, 100.0]) == pytest.approx([1.0, 5.0])
    with pytest.raises(ValueError):
        stats.paired_ratios([1.0], [1.0, 2.0])


def probe_data(scheduler_losses: list[float]) -> dict:
    off = [100.0] * len(scheduler_losses)
    on = [100.0 * (1 - loss / 100) for loss in scheduler_losses]
    row = {"rps_rounds": off, "rounds_throughput_loss_pct": [0.0] * len(off), "p50_ms": 7.0,
           "rounds_p99_ms": [20.0] * len(off), "requests": 1000}
    return {"service": {"off": row, "scheduler": {**row, "rps_rounds": on, "rounds_throughput_loss_pct": scheduler_losses},
                        "scheduler+syscalls": {**row, "rounds_service_syscalls_per_s": [13000.0]}},
            "scheduler": {"runs": {"off": [5000.0], "on": [6600.0]}, "probe_cost_ns_round_trip": 1600.0},
            "syscall": {"runs": {"off": [200.0], "on_target": [700.0], "on_other_process": [350.0]},
                        "ns_per_call_median": {"off": 200.0, "on_target": 700.0, "on_other_process": 350.0},
                        "probe_cost_ns_target": 500.0, "probe_cost_ns_other_process": 150.0},
            "settings": {"rounds": "4", "round_s": "4.0", "clients": "2", "syscall_runs": "1"}}


def test_probe_overhead_is_not_claimed_when_rounds_differ_by_more_than_it():
    noisy = probes({"probes": probe_data([0.6, -4.0, 5.0, 0.5])})
    assert "disagree on its sign" in noisy["scheduler_verdict"]
    assert "cannot promise it" in noisy["budget"]
    assert "0.6 %" not in noisy["budget"].split("median round")[0]
    steady = probes({"probes": probe_data([0.5, 0.7, 0.6, 0.8])})
    assert "every one of the 4 rounds" in steady["scheduler_verdict"] and "every round stayed within it" in steady["budget"]
    assert "13,000 system calls per second" in steady["syscall_load"] and "0.65 % of a core" in steady["syscall_load"]


def test_fusion_keeps_the_default_unless_the_best_cell_is_ahead_beyond_noise():
    queries = [str(i) for i in range(200)]
    base = {q: 0.6 + 0.1 * (i % 5) for i, q in enumerate(queries)}

    def data(best_gain: dict) -> dict:
        grid = [{"rrf_k": 1.0, "bm25_weight": 1.0, "ndcg@10": 0.70}, {"rrf_k": 5.0, "bm25_weight": 1.2, "ndcg@10": 0.69},
                {"rrf_k": 60.0, "bm25_weight": 1.0, "ndcg@10": 0.66}]
        cells = {"best": {"rrf_k": 1.0, "bm25_weight": 1.0, "ndcg@10": 0.70, "per_query_ndcg@10": best_gain},
                 "default": {"rrf_k": 5.0, "bm25_weight": 1.2, "ndcg@10": 0.69, "per_query_ndcg@10": base},
                 "plain_rrf": {"rrf_k": 60.0, "bm25_weight": 1.0, "ndcg@10": 0.66, "per_query_ndcg@10": base}}
        return {"fusion": {"grid": grid, "cells": cells, "queries": 200, "depth_chunks": 300,
                           "alone_ndcg@10": {"dense": 0.6, "bm25": 0.6}}}

    tied = fusion(data({q: v + (0.2 if i % 2 else -0.19) for i, (q, v) in enumerate(base.items())}))
    assert "the default is kept" in tied["choice"] and "**0.7000** (best)" in tied["table"]
    ahead = fusion(data({q: v + 0.03 for q, v in base.items()}))
    assert "should be revisited" in ahead["choice"]
