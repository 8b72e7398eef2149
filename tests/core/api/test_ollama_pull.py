"""``/api/pull`` and ``/api/delete`` through the official ``ollama`` package, against a server
whose downloads go to the loopback hub (tests/core/models/hub/hub_fixture.py): progress in
Ollama's shape, the pulled model listed under its Ollama name with the digest the pull
reported, shown from its files, deleted; names RadixChat cannot pull refused in one line."""

from __future__ import annotations

import hashlib
import json

import httpx
import ollama
import pytest

from core.api.ollama_pull import PullTarget, parse_name
from core.api.server import ApiServer
from tests.core.engine.helpers import start_engine
from tests.core.models.hub.hub_fixture import BIG_MLX, ONE_GGUF, TINY_MLX, TWO_GGUF
from tests.core.models.test_catalog import write_gguf


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    engine = start_engine(tmp_path_factory.mktemp("ollama-pull") / "data", tiny_model)
    yield engine
    engine.shutdown()


@pytest.fixture
def client(engine, loopback_hub):
    with ApiServer(engine, "127.0.0.1", 0) as server, ollama.Client(host=server.address) as c:
        yield c


def names(client) -> list[str]:
    return [m.model for m in client.list().models]


def test_a_gguf_pulled_by_its_quantization_is_listed_shown_and_deleted(client, loopback_hub):
    file = loopback_hub.repos[ONE_GGUF].files["solo-Q4_K_M.gguf"]
    name = f"hf.co/{ONE_GGUF}:Q4_K_M"
    statuses = list(client.pull(name, stream=True))
    assert statuses[0].status == "pulling manifest"
    assert [s.status for s in statuses[-3:]] == [
        "verifying sha256 digest",
        "writing manifest",
        "success",
    ]
    progress = [s for s in statuses if s.digest]
    assert progress and all(s.digest == f"sha256:{file.sha256}" for s in progress)
    assert progress[-1].completed == progress[-1].total == file.size
    assert all(s.status == f"pulling {file.sha256[:12]}" for s in progress)

    listed = {m.model: m for m in client.list().models}
    assert name in listed and listed[name].digest == file.sha256  # the file's own hash
    assert listed[name].details.format == "gguf" and listed[name].size == file.size
    shown = client.show(name.lower())  # names are matched without regard to case
    assert shown.details.format == "gguf" and shown.modelinfo["general.architecture"]
    assert shown.capabilities[0] == "completion"
    assert client.show(f"{ONE_GGUF}:solo-Q4_K_M.gguf").details == shown.details  # the spec

    assert client.delete(name).status == "success"
    assert name not in names(client)
    with pytest.raises(ollama.ResponseError) as gone:
        client.delete(name)
    assert gone.value.status_code == 404 and "not found" in gone.value.error


def test_an_mlx_repo_pulled_whole_has_the_digest_the_pull_reported(client, loopback_hub):
    from core.models.hub import client as hub

    # its digest: the hash of the pulled files' names and blob hashes, before and after
    files = hub.plan(TINY_MLX).files
    lines = "\n".join(sorted(f"{f.path} {f.etag}" for f in files))
    expected = hashlib.sha256(lines.encode()).hexdigest()
    statuses = list(client.pull(f"huggingface.co/{TINY_MLX}", stream=True))
    assert {s.digest for s in statuses if s.digest} == {f"sha256:{expected}"}
    model = {m.model: m for m in client.list().models}[f"hf.co/{TINY_MLX}:latest"]
    assert model.digest == expected and model.size == sum(f.size for f in files)
    assert model.details.format == "safetensors" and model.details.family == "llama"
    again = client.pull(f"hf.co/{TINY_MLX}:latest", stream=False)  # all here: nothing to fetch
    assert again.status == "success"
    assert client.delete(f"hf.co/{TINY_MLX}").status == "success"
    assert f"hf.co/{TINY_MLX}:latest" not in names(client)


@pytest.mark.parametrize("streamed", [True, False])
def test_a_client_that_goes_away_cancels_its_pull_and_the_next_resumes(
    client, engine, loopback_hub, streamed
):
    from core.models.hub import hf_cache

    loopback_hub.rate = 4e6  # bytes a second: the pull takes seconds
    size = sum(f.size for f in loopback_hub.repos[BIG_MLX].files.values())
    address = str(client._client.base_url).rstrip("/")
    body = {"model": f"hf.co/{BIG_MLX}", "stream": streamed}
    if streamed:
        with httpx.stream("POST", address + "/api/pull", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if '"completed"' in line and json.loads(line)["completed"] > 2**20:
                    break  # a megabyte arrived: now go away
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(address + "/api/pull", json=body, timeout=1.5)
    loopback_hub.wait_idle(timeout=30)  # the download noticed and stopped
    assert 0 < loopback_hub.served(BIG_MLX) < size  # not the whole model
    partial = hf_cache.repo_folder(BIG_MLX) / "blobs"
    kept = sum(p.stat().st_size for p in partial.glob("*.incomplete"))
    assert kept > 0  # what arrived is kept for the next pull
    loopback_hub.rate = None
    assert client.pull(f"hf.co/{BIG_MLX}").status == "success"  # resumed
    assert f"hf.co/{BIG_MLX}:latest" in names(client)
    assert client.delete(f"hf.co/{BIG_MLX}").status == "success"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("llama3.2", "not Ollama's library"),
        (f"hf.co/{TWO_GGUF}:Q2_K", "has no Q2_K GGUF file (it has F16, Q8_0)"),
        ("hf.co/nobody/nothing", "no model repo nobody/nothing"),
    ],
)
def test_names_radixchat_cannot_pull_are_refused_in_one_line(client, name, said):
    with pytest.raises(ollama.ResponseError) as refused:
        client.pull(name)
    assert refused.value.status_code == 400 and said in refused.value.error
    assert "\n" not in refused.value.error


def test_the_loaded_model_and_files_of_yours_are_not_deleted(client, engine):
    loaded = names(client)[0]
    with pytest.raises(ollama.ResponseError) as refused:
        client.delete(loaded)
    assert refused.value.status_code == 400 and "loaded model" in refused.value.error
    mine = engine.data_root / "models" / "My-Model.Q8_0.gguf"
    mine.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(mine)
    try:
        assert "my-model:q8_0" in names(client)  # named from the file, quantization as tag
        with pytest.raises(ollama.ResponseError) as refused:
            client.delete("my-model:q8_0")
        assert (
            refused.value.status_code == 400 and "delete the file yourself" in refused.value.error
        )
        assert mine.is_file()
    finally:
        mine.unlink()


@pytest.mark.parametrize(
    ("name", "target"),
    [
        ("hf.co/org/repo", PullTarget(repo_id="org/repo")),
        ("huggingface.co/org/repo:latest", PullTarget(repo_id="org/repo")),
        ("org/repo:q4_k_m", PullTarget(repo_id="org/repo", quantization="Q4_K_M")),
        ("hf.co/org/repo:model-Q8_0.gguf", PullTarget(repo_id="org/repo", file="model-Q8_0.gguf")),
        ("Gemma3-270M", PullTarget(known="gemma3-270m")),
    ],
)
def test_pull_names(name, target):
    assert parse_name(name) == target
