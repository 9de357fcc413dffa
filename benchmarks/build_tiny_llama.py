"""Build the tiny random-weight Llama folder the vLLM tuning benchmark serves (no download, seconds).

    .venv/bin/python benchmarks/build_tiny_llama.py data/models/tiny-llama

``stack.tiny_llama.build_tiny_llama``: a 2-layer, hidden-128 Llama ``config.json`` and a BPE tokenizer trained on
the first 1,000 SciFact abstracts; vLLM serves it with ``--load-format dummy`` (random weights). Its text is noise:
it measures the engine's batching and queueing, not a model. Idempotent: an existing folder is kept.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from stack.tiny_llama import build_tiny_llama


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, nargs="?", default=Path("data/models/tiny-llama"))
    parser.add_argument("--beir", type=Path, default=Path("datasets/scifact"))
    args = parser.parse_args()
    with (args.beir / "corpus.jsonl").open(encoding="utf-8") as corpus:
        texts = [json.loads(line)["text"] for line in itertools.islice(corpus, 1000)]
    print(f"model folder: {build_tiny_llama(args.out, texts)}")


if __name__ == "__main__":
    main()
