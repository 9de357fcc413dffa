"""A tiny Llama model folder built locally, for running a real vLLM engine where no weights can be fetched.

vLLM needs a Hugging Face style folder: ``config.json`` and a tokenizer. With ``load_format="dummy"`` it
fills the weights with random values, so no weight file is needed. The BPE tokenizer is trained here with
``tokenizers`` on local text (no download). The text such a model writes is noise; the engine's
mechanics (scheduling, KV-cache blocks, streaming, preemption) are real, which is what tests and the
tuning sweep's smoke run exercise.

    >>> build_tiny_llama(Path("/tmp/tiny-llama"), ["some local text", ...])
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
# Enough of a chat template for /v1/chat/completions: role-tagged turns, then the assistant's turn.
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant: {% endif %}")


def build_tiny_llama(out_dir: Path, texts: Iterable[str], *, vocab_size: int = 2000, layers: int = 2,
                     hidden: int = 128, heads: int = 4, max_positions: int = 4096) -> Path:
    """Write ``config.json``, ``tokenizer.json``, ``tokenizer_config.json`` and
    ``generation_config.json`` into ``out_dir`` (idempotent: an existing folder is reused)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file() and (out_dir / "tokenizer.json").is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "float32",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": hidden * 2,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": heads,
        "max_position_embeddings": max_positions, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": tokenizer.token_to_id("<s>"), "eos_token_id": tokenizer.token_to_id("</s>"),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": max_positions, "chat_template": CHAT_TEMPLATE}, indent=2))
    (out_dir / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2))
    return out_dir
