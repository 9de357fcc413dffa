"""Step 3's written answers (tuning/written_answers.py): the settings of a service writing through the model server,
and how the report shows each side."""

from __future__ import annotations

from rag.settings import GenerationSettings, RagheatSettings
from tuning.model_server_load import RunningModel
from tuning.report import _written_html, answers_words, written_rows
from tuning.written_answers import written_sections

MODEL = RunningModel("http://127.0.0.1:9999/v1", 123, "model", max_model_len=512, max_num_seqs=4)


def test_a_written_answer_goes_to_the_model_server_with_passages_that_fit_its_context():
    sections = written_sections({"rerank": {"head": "/x/head.npz"}}, MODEL, 10_000.0)
    assert sections["rerank"] == {"head": "/x/head.npz"}  # what the steps before chose stays
    assert sections["generation"] == {"generator": "openai", "base_url": MODEL.url, "model": "model",
                                      "prompt_budget_tokens": 116}
    assert sections["admission"] == {"deadline_ms": 10_000.0, "max_timeout_ms": 10_000}
    settings = RagheatSettings(**sections)  # the service accepts them
    assert settings.generation.prompt_budget_tokens + settings.generation.max_tokens < MODEL.max_model_len


def test_a_long_context_keeps_the_default_budget_and_a_budget_given_is_kept():
    long = RunningModel(MODEL.url, 1, "model", max_model_len=4096, max_num_seqs=8)
    assert written_sections({}, long, 5000.0)["generation"]["prompt_budget_tokens"] == \
        GenerationSettings().prompt_budget_tokens
    given = written_sections({"generation": {"prompt_budget_tokens": 100}}, MODEL, 5000.0)
    assert given["generation"]["prompt_budget_tokens"] == 100


def test_a_fractional_objective_is_a_deadline_the_service_accepts():
    sections = written_sections({}, MODEL, 2500.5)
    assert RagheatSettings(**sections).admission.deadline_ms == 2500.5


def _side(limits, p50, answers):
    return {"limits": limits, "p50_ms": {"median": p50, "spread": 1.0}, "p99_ms": {"median": 2 * p50, "spread": 9.0},
            "stages": {"generate_prefill": {"p50_ms": p50 / 4, "p99_ms": p50 / 2}}, "answers": answers,
            "at_load": {"qps": 2.0, "p99_ms": {"median": 3 * p50, "spread": 5.0, "rounds": [1, 2]}}}


def test_the_report_shows_each_side_with_its_limits_first_token_and_writers():
    written = {"questions": 20, "rounds": 5, "rate": 2.0, "deadline_ms": 10_000.0, "same": False,
               "sides": {"before": _side({"max_num_seqs": 4, "max_model_len": 2048}, 900.0,
                                         {"openai": 80, "extractive (slow)": 20}),
                         "after": _side({"max_num_seqs": 8, "max_model_len": 2048}, 700.0, {"openai": 100})}}
    rows = written_rows({"model_server": {"written": written}})
    assert [r["side"] for r in rows] == ["before step 3", "after step 3"]
    assert rows[1]["first_token_p50_ms"] == 175.0 and rows[1]["p99_at_rate_ms"] == 2100.0
    assert answers_words(rows[0]["answers"]) == "openai 80, extractive (slow) 20"
    page = _written_html({"model_server": {"written": written}})
    assert page.count("<tr>") == 3 and "8 x 2048" in page and "extractive (slow) 20" in page
    assert written_rows({"model_server": {"ran": False}}) == [] and _written_html({"model_server": {}}) == ""
