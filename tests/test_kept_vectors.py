"""The encoder outputs kept between runs (tests/kept_vectors.py) are the encoder's: a later run reads back exactly the
vectors and token states earlier runs got from the real encoder, for the indexes it asks in, without running the
encoder, and two runs saving into one folder keep both runs' outputs."""

from __future__ import annotations

import numpy as np

from kept_vectors import KeptVectors

TEXTS = ["Vitamin D deficiency is associated with bone density loss.",
         "Tides are caused by the gravitational pull of the Moon.",
         "0-dimensional biomaterials lack inductive properties.",
         "Bread dough rises because yeast ferments sugar."]


def embed(embedder, texts):
    states: dict[int, np.ndarray] = {}
    vectors = embedder.embed_many(texts, on_tokens=lambda i, s: states.setdefault(i, np.array(s)))
    return vectors, [states[i] for i in range(len(texts))]


def test_kept_outputs_are_the_encoders_and_survive_concurrent_saves(embedder, tmp_path):
    first, second = KeptVectors(embedder, tmp_path), KeptVectors(embedder, tmp_path)  # both read an empty folder
    first_vectors, first_states = embed(first, TEXTS[:2])
    second_vectors, second_states = embed(second, TEXTS[2:])
    first.save()
    second.save()
    encoded = np.concatenate([first_vectors, second_vectors]), first_states + second_states

    kept = KeptVectors(embedder, tmp_path)
    assert set(kept.rows) == set(kept.token_rows) and len(kept.rows) == len(TEXTS)
    calls = []
    kept.embedder = type("NoEncoder", (), {"embed_many": lambda *a, **k: calls.append(a), "dimension": 384})()
    vectors, states = embed(kept, TEXTS[::-1])
    assert calls == [], "every output was kept: the encoder must not run"
    assert np.array_equal(vectors, encoded[0][::-1])
    assert all(np.array_equal(got, want) for got, want in zip(states, encoded[1][::-1]))
    assert np.array_equal(kept.embed_many(TEXTS), encoded[0])  # vectors alone, no token states asked for
    # What the encoder returned for each text, as one batch of all of them gives it (token states: its own tokens).
    real_vectors, real_states = embed(embedder, TEXTS)
    np.testing.assert_allclose(encoded[0], real_vectors, atol=1e-3)
    assert [s.shape for s in encoded[1]] == [s.shape for s in real_states]
