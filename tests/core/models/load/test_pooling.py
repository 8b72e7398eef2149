"""How a model's embeddings are pooled, read from its files: sentence-transformers' folder
layout and a GGUF's ``<arch>.pooling_type``; what cannot be run as its authors meant is
refused, saying why."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from core.models.load.pooling import Pooling, pooling_of

TRANSFORMER = {
    "idx": 0,
    "name": "0",
    "path": "",
    "type": "sentence_transformers.models.Transformer",
}
POOLING = {
    "idx": 1,
    "name": "1",
    "path": "1_Pooling",
    "type": "sentence_transformers.models.Pooling",
}
NORMALIZE = {
    "idx": 2,
    "name": "2",
    "path": "2_Normalize",
    "type": "sentence_transformers.models.Normalize",
}
DENSE = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}


def st_folder(path, modules=(TRANSFORMER, POOLING, NORMALIZE), **modes):
    """A model folder with sentence-transformers' files: ``modules.json`` and the Pooling
    module's ``config.json`` with ``modes`` (``pooling_mode_...`` keys) set."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "modules.json").write_text(json.dumps(list(modules)))
    pooling = next((m["path"] for m in modules if m["type"].endswith("Pooling")), "1_Pooling")
    (path / pooling).mkdir(exist_ok=True)
    settings = {"word_embedding_dimension": 64, "include_prompt": True}
    settings.update({f"pooling_mode_{mode}": value for mode, value in modes.items()})
    (path / pooling / "config.json").write_text(json.dumps(settings))
    return path


def test_a_chat_model_is_mean_pooled(tmp_path):
    assert pooling_of(tmp_path, {"model_type": "llama"}) == Pooling("mean", "default")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("mean_tokens", "mean"), ("cls_token", "cls"), ("lasttoken", "last")],
)
def test_sentence_transformers_pooling_is_read(tmp_path, mode, expected):
    folder = st_folder(tmp_path / "m", **{mode: True, "max_tokens": False})
    assert pooling_of(folder, {}) == Pooling(expected, "1_Pooling/config.json")


def test_the_pooling_module_is_found_by_its_path_in_modules_json(tmp_path):
    pooling = {**POOLING, "path": "pool"}
    folder = st_folder(tmp_path / "m", modules=(TRANSFORMER, pooling), lasttoken=True)
    assert pooling_of(folder, {}) == Pooling("last", "pool/config.json")


@pytest.mark.parametrize(
    ("modes", "said"),
    [
        ({"max_tokens": True}, "pooling_mode_max_tokens"),
        ({"mean_sqrt_len_tokens": True}, "pooling_mode_mean_sqrt_len_tokens"),
        ({"weightedmean_tokens": True}, "pooling_mode_weightedmean_tokens"),
        ({"mean_tokens": True, "cls_token": True}, "pooling_mode_mean_tokens, pooling_mode_cls"),
        ({}, "no pooling mode"),
    ],
)
def test_pooling_not_run_here_is_refused(tmp_path, modes, said):
    pooling = pooling_of(st_folder(tmp_path / "m", **modes), {})
    assert pooling.refused is not None and said in pooling.refused


def test_a_module_after_pooling_other_than_normalize_is_refused(tmp_path):
    folder = st_folder(tmp_path / "m", modules=(TRANSFORMER, POOLING, DENSE), mean_tokens=True)
    refused = pooling_of(folder, {}).refused
    assert refused == (
        "its sentence-transformers pipeline has a Dense module (2_Dense), which RadixChat "
        "does not run"
    )


@pytest.mark.parametrize("config", [{"use_bidirectional_attention": True}, {"is_causal": False}])
def test_a_model_that_attends_both_ways_is_refused(tmp_path, config):
    folder = st_folder(tmp_path / "m", mean_tokens=True)
    refused = pooling_of(folder, {"model_type": "gemma3_text", **config}).refused
    assert refused is not None and "attends both ways" in refused and "gemma3_text" in refused


def write_gguf(path, **metadata):
    writer = gguf.GGUFWriter(str(path), "qwen3")
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        else:
            writer.add_uint32(key, value)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (1, Pooling("mean", "qwen3.pooling_type")),
        (2, Pooling("cls", "qwen3.pooling_type")),
        (3, Pooling("last", "qwen3.pooling_type")),
        (0, Pooling("mean", "default")),  # none said: per-token states, mean-pooled here
    ],
)
def test_a_gguf_pooling_type_is_read(tmp_path, kind, expected):
    path = write_gguf(tmp_path / "m.gguf", **{"qwen3.pooling_type": kind})
    assert pooling_of(path, {}) == expected


def test_a_gguf_without_pooling_is_mean_pooled_and_a_reranker_is_refused(tmp_path):
    assert pooling_of(write_gguf(tmp_path / "a.gguf"), {}) == Pooling()
    refused = pooling_of(write_gguf(tmp_path / "b.gguf", **{"qwen3.pooling_type": 4}), {}).refused
    assert refused is not None and "reranker" in refused


def test_a_gguf_that_attends_both_ways_is_refused(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", **{"qwen3.attention.causal": False})
    refused = pooling_of(path, {}).refused
    assert refused is not None and "attends both ways" in refused


def test_a_damaged_gguf_is_refused_not_raised(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 20)
    refused = pooling_of(path, {}).refused
    assert refused is not None and "bad.gguf" in refused
