"""HyDE (stage ``hyde``, rag/generation/hyde.py) over a real index (the SciFact subset) with a scripted language model:
the hypothetical passage's dense run is fused into the question's, the stage is timed where it runs, a model that is
down, slow or writes nothing is skipped and said so, and ``+hyde`` eval names. What the real model writes is checked
in tests/vllm/test_real_model.py."""

from __future__ import annotations

import time

import pytest

from rag.errors import ConfigurationError
from rag.eval.runner import parse_retriever_sets, run_retrieval, split_options, split_rerank
from rag.generation.hyde import HydeSkipped, HydeWriter, clean_passage
from rag.generation.llm import GeneratorTooSlow, GeneratorUnavailable
from rag.settings import HydeSettings

QUESTION = "What causes the tides of the oceans?"  # nothing in SciFact is about tides


class Scripted:
    """A ``Completer`` that answers ``text``, raises ``error``, or sleeps ``delay_s`` first; records its calls."""

    def __init__(self, text: str = "", error: Exception | None = None, delay_s: float = 0.0) -> None:
        self.text, self.error, self.delay_s, self.calls = text, error, delay_s, []

    def complete(self, messages, max_tokens, timeout_s, regex=None) -> str:
        self.calls.append((messages, max_tokens, timeout_s))
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return self.text


@pytest.fixture
def with_writer(pipeline):
    """Installs a HyDE writer on the shared pipeline for one test, and takes it away again."""
    before = pipeline.hyde

    def install(completer, **settings) -> HydeWriter:
        pipeline.hyde = HydeWriter(completer, HydeSettings(**settings))
        return pipeline.hyde

    yield install
    pipeline.hyde = before


def _docs(pipeline, fused, k=10) -> list[str]:
    return [doc for doc, _ in pipeline.chunk_hits_to_docs(fused.hits)][:k]


def test_clean_passage_strips_labels_markers_and_a_cut_off_sentence():
    assert clean_passage('Passage: "Tides are caused by the moon. They rise tw') == "Tides are caused by the moon."
    assert clean_passage("<|im_start|>Answer:  The moon pulls\n the sea.<|im_end|>") == "The moon pulls the sea."
    assert clean_passage("no full stop anywhere") == "no full stop anywhere"  # nothing whole to keep: kept as is


@pytest.mark.parametrize("completer, reason", [
    (Scripted(error=GeneratorUnavailable("connection refused")), "unavailable"),
    (Scripted(error=GeneratorTooSlow("read timed out")), "slow"),
    (Scripted(text="  <|im_end|> "), "empty"),
    (Scripted(text="The moon pulls the oceans.", delay_s=0.08), "slow"),  # answered, but after the deadline
    (Scripted(text="What causes the tides of the oceans"), "empty"),  # the question restated
])
def test_the_writer_skips_a_model_that_is_down_slow_or_writes_nothing(completer, reason):
    writer = HydeWriter(completer, HydeSettings(deadline_ms=50, max_tokens=32))
    with pytest.raises(HydeSkipped) as info:
        writer.write(QUESTION)
    assert info.value.reason == reason and str(info.value).startswith("hyde:")
    (messages, max_tokens, timeout_s), = completer.calls
    assert messages[-1] == {"role": "user", "content": QUESTION} and max_tokens == 32 and timeout_s == 0.05


def test_the_passage_drives_a_second_dense_query_fused_with_the_question(pipeline, with_writer):
    baseline = pipeline.retrieve(QUESTION, 30, ["dense"], hyde=False, rerank=False)
    before = _docs(pipeline, baseline)
    # A passage that is, word for word, a document the question alone does not find in its top 10.
    target = next(c for c in pipeline.index.chunks if c.doc_id not in before)
    completer = Scripted(text=target.text)
    with_writer(completer)
    fused = run = pipeline.retrieve(QUESTION, 30, ["dense"], hyde=True, rerank=False)
    names = [s.name for s in run.stages]
    assert names == ["embed", "hyde", "retrieve_dense"], names
    assert len(completer.calls) == 1 and run.skipped == {}
    assert target.doc_id in _docs(pipeline, fused, 3)  # first in the passage's run: near the top once fused
    # The question's own best documents are kept too (fused, not replaced).
    assert before[0] in _docs(pipeline, fused, 3)
    assert run.route == "dense" and run.retrieved == {"dense": len(fused.hits)}


def test_a_skipped_passage_leaves_the_question_alone_and_says_so(pipeline, with_writer):
    with_writer(Scripted(error=GeneratorUnavailable("connection refused")))
    fused = run = pipeline.retrieve(QUESTION, 10, ["dense", "bm25"], hyde=True)
    assert set(run.skipped) == {"hyde"} and "connection refused" in run.skipped["hyde"]
    assert "hyde" in [s.name for s in run.stages]  # the time lost waiting is shown
    assert fused.hits == pipeline.retrieve(QUESTION, 10, ["dense", "bm25"], hyde=False).hits


def test_hyde_runs_only_when_asked_and_only_with_dense(pipeline, with_writer):
    completer = Scripted(text="The moon's gravity pulls the oceans toward it.")
    with_writer(completer)
    by_default = pipeline.retrieve(QUESTION, 10, ["dense"])  # hyde.enabled is off by default
    without_dense = pipeline.retrieve(QUESTION, 10, ["bm25"], hyde=True)  # no dense run to add a query to
    assert completer.calls == []
    assert "hyde" not in [s.name for s in by_default.stages + without_dense.stages]


def test_asking_for_hyde_without_a_language_model_is_refused(pipeline):
    assert pipeline.hyde is None  # the shared pipeline answers extractively
    with pytest.raises(ValueError, match="hyde needs a language model"):
        pipeline.retrieve(QUESTION, 10, ["dense"], hyde=True)
    with pytest.raises(ValueError, match=r"\+hyde needs a language model"):
        run_retrieval(pipeline, {"q": QUESTION}, ("dense", "hyde"), depth=10)


def test_hyde_enabled_without_a_generator_fails_at_start_up(settings, subset_index):
    from rag.pipeline import RagPipeline

    on = settings.model_copy(update={"hyde": HydeSettings(enabled=True)})
    with pytest.raises(ConfigurationError, match="hyde.enabled needs a language model"):
        RagPipeline(on, subset_index).warm_up()


def test_eval_names_with_hyde(pipeline, with_writer):
    sets = parse_retriever_sets("hybrid,hybrid+hyde,dense+hyde+rerank")
    assert sets == {"hybrid": ("dense", "bm25"), "hybrid+hyde": ("dense", "bm25", "hyde"),
                    "dense+hyde+rerank": ("dense", "hyde", "rerank")}
    assert split_options(sets["dense+hyde+rerank"]) == (("dense",), True, True)
    assert split_rerank(sets["hybrid+hyde"]) == (("dense", "bm25"), False)
    for bad in ("bm25+hyde", "hyde+dense", "dense+rerank+hyde"):
        with pytest.raises(ValueError, match="--retrievers"):
            parse_retriever_sets(bad)
    completer = Scripted(text="The moon's gravity pulls the oceans toward it.")
    with_writer(completer)
    _, _, runs = run_retrieval(pipeline, {"a": QUESTION, "b": "Does aspirin prevent heart attacks?"},
                               sets["hybrid+hyde"], depth=10)
    assert len(completer.calls) == 2 and all(r.skipped == {} for r in runs)
