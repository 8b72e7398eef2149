"""A model config that asks for the impossible is refused before anything is allocated;
a config.json that is not a JSON object is one line."""

from __future__ import annotations

import json
import shutil
import time

import mlx.core as mx
import pytest

from core.cli.main import main
from core.errors import ModelLoadError
from core.models.load.loader import load_model
from core.models.load.memory_estimate import check_fits, estimate_weights, machine_memory

pytestmark = pytest.mark.faults


def with_config(tiny_model, tmp_path, change) -> str:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(change(config)))
    return str(folder)


def test_an_impossible_config_is_refused_before_anything_is_allocated(tiny_model, tmp_path):
    """Today: 78 s and 9 GB before it failed."""
    spec = with_config(
        tiny_model, tmp_path, lambda c: {**c, "num_hidden_layers": 100000, "hidden_size": 65536}
    )
    mx.reset_peak_memory()
    started = time.perf_counter()
    with pytest.raises(
        ModelLoadError,
        match=r"config.json describes a model of at least .* more than "
        r"this machine's .* GiB of memory; nothing was loaded",
    ):
        load_model(spec, tmp_path, "float32")
    seconds = time.perf_counter() - started
    assert mx.get_peak_memory() < 2**20, "MLX allocated before refusing"
    print(f"refused in {seconds:.3f} s")


@pytest.mark.parametrize(
    "content, kind", [("[1, 2, 3]", "list"), ('"llama"', "string"), ("null", "null")]
)
def test_a_config_that_is_not_an_object_is_one_line(tiny_model, tmp_path, capsys, content, kind):
    """Today: AttributeError: 'list' object has no attribute 'get' (a traceback)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model, folder)
    (folder / "config.json").write_text(content)
    code = main(
        ["chat", "--json", "--model", str(folder), "--data-dir", str(tmp_path / "data"), "hi"]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"must hold a JSON object, not a JSON {kind}" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_count_that_is_not_a_number_is_one_line(tiny_model, tmp_path):
    spec = with_config(tiny_model, tmp_path, lambda c: {**c, "num_hidden_layers": "many"})
    with pytest.raises(
        ModelLoadError, match="num_hidden_layers must be a positive whole number, not 'many'"
    ):
        load_model(spec, tmp_path)


def test_the_estimate_is_a_lower_bound_that_passes_real_models():
    smollm2 = {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "tie_word_embeddings": True,
    }
    estimate = estimate_weights(smollm2)
    assert 0.7 * 134_515_008 < estimate.weights <= 134_515_008  # its true count (a gated MLP)
    assert (
        check_fits(smollm2, "config.json", "float32", memory=2**30).nbytes == 4 * estimate.weights
    )
    quantized = {**smollm2, "quantization": {"bits": 4, "group_size": 64}}
    assert estimate_weights(quantized).nbytes == estimate.weights // 2
    assert machine_memory() > 2**30
