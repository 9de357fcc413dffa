"""The support check and what it decides, and the generator-down path: a closed port (unavailable) and a server
that never answers (slow) both give the extractive answer, flagged degraded, within the deadline; a written answer
with an unsupported sentence has it dropped or marked, and one with no supported sentence is replaced by the
extractive answer (degraded, unsupported). The model is a scripted OpenAI-compatible server on loopback whose
text is built from the passages it is sent. No vLLM needed."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rag.childproc import free_port
from rag.generation.support import SupportChecker, split_cited_sentences
from rag.pipeline import RagPipeline
from rag.retrieval.lexical import LexicalAnalyzer
from rag.types import Chunk

PASSAGES = [Chunk(0, "d1", "Tides", "Tides are caused by the gravitational pull of the moon on the oceans.", 0, 70),
            Chunk(1, "d2", "Seasons", "Seasons follow from the tilt of the Earth's axis toward the sun.", 0, 66)]


def test_split_moves_markers_written_after_the_full_stop_to_their_sentence():
    pairs = split_cited_sentences("The moon pulls the oceans. [1] Axial tilt makes seasons [2][1]. Nothing here.")
    assert pairs == [("The moon pulls the oceans. [1]", (1,)), ("Axial tilt makes seasons [2][1].", (2, 1)),
                     ("Nothing here.", ())]


def test_support_flags_wrong_citations_and_uncited_claims():
    checker = SupportChecker(LexicalAnalyzer(), {}, threshold=0.5)
    result = checker.check("The moon's gravitational pull causes tides [1]. The tilt of the Earth axis makes tides [1]. "
                           "Volcanoes erupt basalt. The axis tilt gives seasons [3].", PASSAGES)
    assert [s.supported for s in result] == [True, False, False, False]
    assert result[0].score > result[1].score and result[2].score == 0.0 and result[3].citations == (3,)


def test_support_threshold_is_validated():
    with pytest.raises(ValueError, match="threshold"):
        SupportChecker(LexicalAnalyzer(), {}, threshold=1.5)


def _openai_pipeline(settings, subset_index, base_url: str, **generation) -> RagPipeline:
    gen = settings.generation.model_copy(update={"generator": "openai", "base_url": base_url, "model": "m",
                                                 **generation})
    pipeline = RagPipeline(settings.model_copy(update={"generation": gen}), subset_index)
    pipeline.warm_up()
    return pipeline


class SilentServer:
    """Accepts connections and reads, but never answers a byte."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns, self.stop = [], False
        threading.Thread(target=self._accept, daemon=True).start()
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def __exit__(self, *exc) -> None:
        self.stop = True
        self.sock.close()
        for conn in self.conns:
            conn.close()


QUESTION = "What causes drug resistance in bacteria?"


def test_closed_port_degrades_to_extractive_at_once(settings, subset_index, pipeline):
    llm = _openai_pipeline(settings, subset_index, f"http://127.0.0.1:{free_port()}/v1", first_token_timeout_s=5.0)
    start = time.perf_counter()
    result = llm.query(QUESTION, 5)
    elapsed = time.perf_counter() - start
    assert result.degraded_reason == "unavailable" and "refused" in result.degraded_detail, result.degraded_detail
    assert result.generator == "extractive" and result.answer == pipeline.query(QUESTION, 5).answer
    assert elapsed < 2.0, f"a refused connection took {elapsed:.2f} s to degrade"
    names = [s.name for s in result.stages]
    assert names[-2:] == ["generate_prefill", "generate"], names  # the failed wait is visible, then the fallback


def test_silent_server_degrades_within_the_first_token_timeout(settings, subset_index):
    with SilentServer() as url:
        llm = _openai_pipeline(settings, subset_index, url, first_token_timeout_s=0.4)
        start = time.perf_counter()
        result = llm.query(QUESTION, 5)
        elapsed = time.perf_counter() - start
    assert result.degraded_reason == "slow" and "timed out" in result.degraded_detail, result.degraded_detail
    assert result.sentences and result.generator == "extractive"
    assert 0.4 <= elapsed < 2.0, f"degrading took {elapsed:.2f} s with a 0.4 s first-token timeout"
    prefill = next(s for s in result.stages if s.name == "generate_prefill")
    assert prefill.seconds >= 0.35


def test_degraded_flag_reaches_the_http_response_and_the_metrics(settings, subset_index):
    import httpx
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    from ragheat.service import build_service
    from stack.servers import BackgroundServer

    llm = _openai_pipeline(settings, subset_index, f"http://127.0.0.1:{free_port()}/v1")
    with build_service(llm.settings, llm, registry=CollectorRegistry()) as service, \
            BackgroundServer(service.app) as url, httpx.Client(base_url=url, timeout=30) as client:
        body = client.post("/v1/query", json={"query": QUESTION}).json()
        stream = client.post("/v1/query/stream", json={"query": QUESTION}).text
        metrics = client.get("/metrics").text
    assert body["degraded"] is True and body["generator"] == "extractive" and body["degraded_reason"] == "unavailable"
    assert "refused" in body["degraded_detail"] and body["unsupported_policy"] is None
    assert '"degraded": true' in stream and "event: answer" in stream
    degraded = degraded_counts(metrics)
    assert degraded == {"unavailable": 2, "slow": 0, "unsupported": 0}  # one per request, JSON and streamed
    values = {s.name: s.value for family in text_string_to_metric_families(metrics) for s in family.samples
              if not s.labels}
    assert values["ragheat_generation_ttft_seconds_count"] == 0  # no token ever came


def degraded_counts(metrics_text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels["reason"]: s.value for family in text_string_to_metric_families(metrics_text)
            for s in family.samples if s.name == "ragheat_generation_degraded_total"}


def test_in_process_vllm_without_the_package_is_one_sentence(settings):
    # The main environment has no vllm package (it lives in .venv-vllm): asking for it must say what to do.
    from rag.errors import ConfigurationError
    from rag.generation.vllm_engine import InProcessVllmGenerator

    generator = InProcessVllmGenerator(settings.generation.model_copy(update={"generator": "vllm", "model": "m"}))
    with pytest.raises(ConfigurationError, match="install_vllm.sh"):
        generator.warm_up()


class SlowStreamingServer:
    """An OpenAI-compatible chat endpoint that streams a token every 50 ms for 10 s, counting what it sent
    until its client went away."""

    def __enter__(self) -> str:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.sent, self.disconnected = 0, threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                chunk = b'data: {"choices": [{"delta": {"content": "word "}}]}\n\n'
                try:
                    for _ in range(200):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        outer.sent += 1
                        time.sleep(0.05)
                except OSError:
                    outer.disconnected.set()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_client_that_leaves_a_stream_stops_the_generation(settings, subset_index):
    import httpx

    from rag.api.app import create_app
    from stack.servers import BackgroundServer

    model = SlowStreamingServer()
    with model as llm_url:
        llm = _openai_pipeline(settings, subset_index, llm_url, deadline_s=60.0)
        with BackgroundServer(create_app(llm.settings, pipeline=llm)) as url:
            with httpx.Client(base_url=url, timeout=30) as client:
                with client.stream("POST", "/v1/query/stream", json={"query": QUESTION}) as response:
                    for line in response.iter_lines():
                        if line == "event: token":
                            break  # one token seen: now leave
            left_at = model.sent
            # The first token after the disconnect stops the generation, which closes the model's stream.
            assert model.disconnected.wait(5.0), f"the model kept streaming to nobody ({model.sent} tokens sent)"
            assert model.sent < left_at + 40 < 200, (left_at, model.sent)


# -- what the support check decides, with a model whose text is under control -----------------------------------

INVENTED = "Volcanoes on Mars erupt purple basalt glass [1]."  # no SciFact abstract says this
ALSO_INVENTED = "Penguins juggle quartz pebbles at dawn [2]."
PASSAGE_1 = re.compile(r"\[1\] [^\n]*\n(.*?)(?:\n\n\[2\] |\n\nQuestion: )", re.S)


def first_sentence_of_passage_1(messages: list[dict]) -> str:
    """The first ten words of the passage the prompt numbers [1] as one cited sentence (no full stop inside):
    every term of it is in that passage, so the support check must accept it."""
    passage = PASSAGE_1.search(messages[-1]["content"]).group(1)
    return " ".join(re.findall(r"[A-Za-z]+", passage)[:10]) + " [1]."


SCRIPTS = {
    "supported": lambda m: first_sentence_of_passage_1(m),
    "mixed": lambda m: f"{first_sentence_of_passage_1(m)} {INVENTED}",
    "none": lambda m: f"{INVENTED} {ALSO_INVENTED}",
}


class ScriptedModel:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback that streams, word by word, the text
    ``SCRIPTS[self.script]`` builds from the passages in the prompt it receives."""

    def __enter__(self) -> "ScriptedModel":
        outer = self
        self.script = "supported"

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                words = SCRIPTS[outer.script](body["messages"]).split(" ")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, word in enumerate(words):
                    piece = word if i == 0 else " " + word
                    self.wfile.write(b"data: " + json.dumps({"choices": [{"delta": {"content": piece}}]}).encode()
                                     + b"\n\n")
                    self.wfile.flush()
                usage = {"choices": [], "usage": {"completion_tokens": len(words)}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def scripted():
    with ScriptedModel() as model:
        yield model


def sse_events(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_a_fully_supported_answer_is_served_verbatim(settings, subset_index, scripted):
    scripted.script = "supported"
    result = _openai_pipeline(settings, subset_index, scripted.url).query(QUESTION, 5)
    assert result.generator == "openai" and not result.degraded and result.unsupported_policy == "drop"
    assert [s.supported for s in result.support] == [True] and result.dropped_sentences == 0
    assert result.answer == result.support[0].text


def test_drop_leaves_the_unsupported_sentence_out_and_says_so(settings, subset_index, scripted):
    scripted.script = "mixed"
    result = _openai_pipeline(settings, subset_index, scripted.url).query(QUESTION, 5)
    assert [s.supported for s in result.support] == [True, False], result.support
    assert result.generator == "openai" and not result.degraded
    assert result.unsupported_policy == "drop" and result.dropped_sentences == 1 and result.unsupported_sentences == 1
    assert result.answer == result.support[0].text and "Volcanoes" not in result.answer


def test_mark_keeps_the_unsupported_sentence_flagged(settings, subset_index, scripted):
    from rag.types import UNSUPPORTED_MARK

    scripted.script = "mixed"
    result = _openai_pipeline(settings, subset_index, scripted.url, unsupported="mark").query(QUESTION, 5)
    assert result.unsupported_policy == "mark" and result.dropped_sentences == 0 and result.unsupported_sentences == 1
    assert result.answer == f"{result.support[0].text} {INVENTED} {UNSUPPORTED_MARK}"


def test_no_supported_sentence_serves_the_extractive_answer(settings, subset_index, scripted, pipeline):
    scripted.script = "none"
    result = _openai_pipeline(settings, subset_index, scripted.url).query(QUESTION, 5)
    assert result.degraded_reason == "unsupported" and result.generator == "extractive"
    assert "none of the 2 written sentences" in result.degraded_detail
    assert result.answer == pipeline.query(QUESTION, 5).answer and "Volcanoes" not in result.answer
    # The model did answer: its timing and its flagged sentences are kept, and every one counts as dropped.
    assert result.generation is not None and result.generation.output_tokens == len(SCRIPTS["none"]([]).split())
    assert result.unsupported_sentences == result.dropped_sentences == 2
    assert [s.name for s in result.stages][-4:] == ["generate_prefill", "generate_decode", "support_check", "generate"]


def test_the_http_answers_and_streams_say_what_was_dropped_and_count_fallbacks(settings, subset_index, scripted):
    import httpx
    from prometheus_client import CollectorRegistry

    from ragheat.service import build_service
    from stack.servers import BackgroundServer

    llm = _openai_pipeline(settings, subset_index, scripted.url)
    with build_service(llm.settings, llm, registry=CollectorRegistry()) as service, \
            BackgroundServer(service.app) as url, httpx.Client(base_url=url, timeout=30) as client:
        scripted.script = "mixed"
        body = client.post("/v1/query", json={"query": QUESTION}).json()
        mixed = sse_events(client.post("/v1/query/stream", json={"query": QUESTION}).text)
        scripted.script = "none"
        fallback = client.post("/v1/query", json={"query": QUESTION}).json()
        replaced = sse_events(client.post("/v1/query/stream", json={"query": QUESTION}).text)
        metrics = client.get("/metrics").text

    assert body["generator"] == "openai" and body["degraded"] is False and "Volcanoes" not in body["answer"]
    assert body["unsupported_policy"] == "drop" and body["dropped_sentences"] == 1
    assert [(s["supported"], s["dropped"]) for s in body["support"]] == [(True, False), (False, True)]

    kinds = [k for k, _ in mixed]
    assert kinds[0] == "sources" and "token" in kinds and kinds[-1] == "done" and "degraded" not in kinds, kinds
    dropped = next(d for k, d in mixed if k == "dropped")
    assert dropped["count"] == 1 and dropped["sentences"][0]["text"] == INVENTED and dropped["sentences"][0]["position"] == 1
    assert [d["text"] for k, d in mixed if k == "answer"] == [body["support"][0]["text"]]
    assert kinds.index("dropped") < kinds.index("answer")
    assert mixed[-1][1]["dropped_sentences"] == 1 and mixed[-1][1]["unsupported_policy"] == "drop"

    assert fallback["degraded"] is True and fallback["degraded_reason"] == "unsupported"
    assert fallback["generator"] == "extractive" and "Volcanoes" not in fallback["answer"]
    assert fallback["generation"]["output_tokens"] > 0 and fallback["dropped_sentences"] == 2
    tokens = sum(k == "token" for k, _ in replaced)
    degraded = next(d for k, d in replaced if k == "degraded")
    assert tokens > 0 and degraded == {"reason": "unsupported", "detail": fallback["degraded_detail"],
                                       "discard_tokens": tokens}
    answers = [d["text"] for k, d in replaced if k == "answer"]
    assert " ".join(answers) == fallback["answer"] and "dropped" not in [k for k, _ in replaced]
    assert replaced[-1][1]["degraded_reason"] == "unsupported"

    assert degraded_counts(metrics) == {"unavailable": 0, "slow": 0, "unsupported": 2}
