"""``ragheat demo --generator vllm`` and ``stack up --vllm-model auto`` choose their model without starting one: the
installed real model by default, a folder that cannot be served refused with the reason, the operator's choice kept.
"""

from __future__ import annotations

import json

import pytest
import typer

from rag.settings import RagheatSettings
from ragheat.commands.demo_llm import resolve_model
from ragheat.commands.stack import _auto_model
from stack.smollm import DEFAULT_MODEL_DIR, folder_problems, installed_model
from stack.vllm import DEFAULT_VLLM_PYTHON


def test_auto_is_the_installed_real_model_and_dummy_is_flagged(tmp_path):
    if installed_model() is None:
        pytest.fail(f"the real model is not installed at {DEFAULT_MODEL_DIR}: run `bash scripts/install_vllm.sh`")
    assert resolve_model("auto") == (DEFAULT_MODEL_DIR, False)
    folder, dummy = resolve_model("dummy")
    assert dummy and (folder / "config.json").is_file()


def test_a_folder_that_cannot_be_served_is_refused_with_its_reason(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(typer.BadParameter, match="no \\*.safetensors weight file"):
        resolve_model(str(tmp_path))
    assert "tokenizer.json is missing" in folder_problems(tmp_path)


def test_stack_up_auto_keeps_the_operators_choice():
    generation = RagheatSettings().generation
    assert _auto_model("dummy", generation, None, {}) == "dummy"
    assert _auto_model("auto", generation, "http://127.0.0.1:9/v1", {}) == "off"
    assert _auto_model("auto", generation, None, {"RAGHEAT_GENERATION__GENERATOR": "extractive"}) == "off"
    served = installed_model() is not None and DEFAULT_VLLM_PYTHON.is_file()
    assert _auto_model("auto", generation, None, {}) == (str(DEFAULT_MODEL_DIR) if served else "off")


def test_serve_generator_vllm_defaults_to_the_installed_model():
    from ragheat.commands.demo_llm import default_llm_model

    if installed_model() is None:
        pytest.fail(f"the real model is not installed at {DEFAULT_MODEL_DIR}: run `bash scripts/install_vllm.sh`")
    assert default_llm_model("vllm", {}) == str(DEFAULT_MODEL_DIR)
    assert default_llm_model(None, {"RAGHEAT_GENERATION__GENERATOR": "vllm"}) == str(DEFAULT_MODEL_DIR)
    # The operator's model wins; the other generators keep theirs (openai: the server's first model).
    assert default_llm_model("vllm", {"RAGHEAT_GENERATION__MODEL": "/models/mine"}) is None
    assert default_llm_model("openai", {}) is None and default_llm_model(None, {}) is None
    generation = RagheatSettings(generation={"generator": "vllm", "model": default_llm_model("vllm", {})}).generation
    assert generation.model == str(DEFAULT_MODEL_DIR) and generation.max_tokens == 96
