"""Files made from a model at load (its tokenizer, a kept conversion) are listed beside their
model, counted, removed with it and cleared on demand; the engine counts them in the disk
budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.cli.main import main
from core.engine.config import EngineConfig
from core.models import derived
from core.models.hashing import FileHashCache
from core.models.hub import download
from core.models.load.loader import load_model
from tests.core.models.hub.hub_fixture import TWO_GGUF

KEY = "ab" * 16


def _fake_conversion(root: Path, key: str = KEY, size: int = 3000) -> Path:
    folder = root / "converted" / key / "float32"
    folder.mkdir(parents=True)
    (folder / "weights.safetensors").write_bytes(b"\0" * size)
    return folder.parent


def test_derived_files_are_found_by_their_model(data_root_with_default, default_model_file):
    root = data_root_with_default
    assert derived.derived_files(root) == []
    load_model("default", root)  # leaves its tokenizer
    model = root / "models" / default_model_file.name
    made = derived.derived_of(root, model)
    assert [f.kind for f in made] == [derived.TOKENIZER] and made[0].size_bytes > 100_000
    sha = FileHashCache.in_data_folder(root).remembered(model)
    assert made[0].key == sha[:32] and made[0].path.name == f"{sha[:32]}.json"
    gone = _fake_conversion(root)  # of a model no longer here
    assert [f.path for f in derived.orphans(root, [model])] == [gone]
    assert derived.derived_bytes(root) == made[0].size_bytes + 3000
    assert derived.remove(derived.orphans(root, [model])) == 3000 and not gone.exists()


def test_models_lists_them_and_clean_deletes_them(
    capsys, data_root_with_default, default_model_file
):
    root = data_root_with_default
    load_model("default", root)
    _fake_conversion(root)
    assert main(["models", "--data-dir", str(root)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("default"))
    assert "MB made from it (tokenizer)" in line
    assert "made from models at load:" in out and "of models no longer here" in out
    assert "`radixchat models clean` deletes them" in out

    assert main(["models", "clean", "--gone", "--data-dir", str(root)]) == 0
    assert capsys.readouterr().out.startswith("deleted 1 files made from models:")
    assert not (root / "converted" / KEY).exists() and derived.derived_files(root)
    assert main(["models", "clean", "--data-dir", str(root)]) == 0
    assert derived.derived_files(root) == []


def test_cache_clear_deletes_them_too(capsys, data_root_with_default):
    root = data_root_with_default
    load_model("default", root)
    assert derived.derived_files(root)
    assert main(["cache", "clear", "--data-dir", str(root)]) == 0
    assert "files made from models at load" in capsys.readouterr().out
    assert derived.derived_files(root) == []


def test_models_rm_deletes_what_was_made_from_the_model(capsys, loopback_hub, tmp_path):
    spec = f"{TWO_GGUF}:tiny-Q8_0.gguf"
    pulled = download.pull(spec, data_root=tmp_path)  # remembers the file's hash
    key = derived.key_of(tmp_path, pulled.path)
    (tmp_path / "tokenizers").mkdir()
    (tmp_path / "tokenizers" / f"{key}.json").write_text("{}")  # as a load leaves it
    assert [f.kind for f in derived.derived_of(tmp_path, pulled.path)] == [derived.TOKENIZER]
    assert main(["models", "rm", spec, "--yes", "--data-dir", str(tmp_path)]) == 0
    assert "made from it" in capsys.readouterr().out
    assert derived.derived_files(tmp_path) == []


# the KV cache's budget: 100 MB less what was made from models and the stored responses'
# room (their eighth, 12.5 MB, for twice as much on disk: 25 MB), a quarter of it at least
@pytest.mark.parametrize(
    ("made", "budget"), [(0, 150 << 19), (30 << 20, 90 << 19), (1 << 30, 25 << 20)]
)
def test_the_engine_counts_them_in_the_disk_budget(tiny_model, tmp_path, made, budget):
    from core.engine.engine import Engine

    if made:
        _fake_conversion(tmp_path, size=made)
    engine = Engine(
        tmp_path, str(tiny_model), config=EngineConfig(disk_budget_bytes=100 << 20)
    ).start()
    try:
        engine.wait_ready(timeout=60)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert stats.derived_bytes == made and stats.disk_cache_budget_bytes == budget
