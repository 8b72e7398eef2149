"""A hostile hub (or one that lies by mistake): what it names never becomes a path
outside the Hugging Face cache, a refused repo leaves nothing behind, and one bad search
result costs only that result.

The loopback hub serves the answers a hostile hub would: a commit id that climbs out of
``snapshots/`` or is absolute, file names with ``..``, absolute paths, backslashes,
drive letters or a NUL, blob names (the hashes the hub lists) that climb out of
``blobs/``, malformed listings, and search cards with impossible figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.cli.main import EXIT_USER_ERROR, main
from core.models.hub import client, download, hf_cache
from core.models.hub.client import HubError
from core.models.hub.search import search
from tests.core.models.hub.hub_fixture import HubFile, HubRepo, LoopbackHub

pytestmark = pytest.mark.faults

HOSTILE = "evil/hostile-model"
GGUF = dict(tags=["gguf"], library_name="gguf", gguf={"total": 448, "architecture": "llama"})
MLX = dict(tags=["mlx"], library_name="mlx", config={"model_type": "llama"})


def _everything_under(folder: Path) -> set[str]:
    """Every path under ``folder`` (links not followed), as text."""
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.exists() else set()


def _gguf_repo(gguf_bytes: bytes, name: str = "model-Q8_0.gguf", **kwargs) -> HubRepo:
    return HubRepo(HOSTILE, {name: HubFile(name, data=gguf_bytes)}, **GGUF, **kwargs)


def _pull_is_refused(capsys, loopback_hub: LoopbackHub, tmp_path: Path, *expected: str) -> str:
    """``radixchat pull HOSTILE``: one line, exit 2, and nothing on disk but what was
    there (no folder of the repo in the HF cache, nothing beside it)."""
    before = _everything_under(tmp_path)
    code = main(["pull", HOSTILE, "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_USER_ERROR, err
    assert len(err.splitlines()) == 1 and err.startswith("radixchat: error: "), err
    for text in expected:
        assert text in err, err
    assert "\x00" not in err
    made = {p for p in _everything_under(tmp_path) - before if not p.startswith("data")}
    assert made == set(), f"a refused pull left {sorted(made)}"
    assert not hf_cache.repo_folder(HOSTILE).exists()
    return err


@pytest.mark.parametrize(
    "commit",
    [
        "../../../../escape/C",
        "../../../../../../../../../../tmp/escape-C",
        "ABSOLUTE",
        "main",
        "0123abc",
        "g" * 40,
        "A" * 40,
        "a" * 40 + "\n",
    ],
)
def test_a_commit_id_that_is_not_one_is_refused(
    capsys, loopback_hub, hub_sources, tmp_path, commit
):
    """Today: ``snapshots/../../../../escape/C/model-Q8_0.gguf`` was linked (exit 0)."""
    if commit == "ABSOLUTE":
        commit = str(tmp_path / "escape" / "C")
    loopback_hub.add(_gguf_repo(hub_sources.gguf.read_bytes(), commit=commit))
    _pull_is_refused(capsys, loopback_hub, tmp_path, HOSTILE, "commit id")
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "name",
    [
        "../../../../../escape/A.gguf",
        "models/../../../../../../escape/A.gguf",
        "ABSOLUTE",
        "..\\..\\..\\..\\..\\escape\\A.gguf",
        "C:\\escape\\A.gguf",
        "C:A.gguf",
        "\\\\attacker\\share\\A.gguf",
        "sub/..\\..\\A.gguf",
        "A\x00.gguf",
    ],
)
def test_a_file_path_outside_its_snapshot_is_refused(
    capsys, loopback_hub, hub_sources, tmp_path, name
):
    """Today: the GGUF was linked at ``tmp_path/escape/A.gguf`` (or its absolute path),
    a NUL ended in a traceback, and the rest were stored under names Windows reads as
    paths elsewhere."""
    if name == "ABSOLUTE":
        name = str(tmp_path / "escape" / "A.gguf")
    loopback_hub.add(_gguf_repo(hub_sources.gguf.read_bytes(), name=name))
    _pull_is_refused(capsys, loopback_hub, tmp_path, HOSTILE, "file")
    assert not (tmp_path / "escape").exists()


def test_one_hostile_file_name_refuses_the_whole_repo(capsys, loopback_hub, hub_sources, tmp_path):
    """A file a model would not even download (a README) names a path outside: the hub's
    answer for this repo is not to be trusted, so nothing of it is fetched."""
    repo = loopback_hub.add_folder(HOSTILE, hub_sources.tiny, **MLX)
    evil = "../../../../escape/README.md"
    repo.files[evil] = HubFile(evil, data=b"# hi\n")
    _pull_is_refused(capsys, loopback_hub, tmp_path, HOSTILE, repr(evil))
    assert loopback_hub.served(HOSTILE) == 0


@pytest.mark.parametrize("kind", ["lfs", "blob"])
def test_a_blob_name_outside_the_blobs_folder_is_refused(
    capsys, loopback_hub, hub_sources, tmp_path, kind
):
    """The hashes the hub lists name the files in ``blobs/``. Today: the download went
    to ``blobs/../../../escape/B.incomplete`` (and stayed there after its hash check)."""
    repo = loopback_hub.add_folder(HOSTILE, hub_sources.tiny, **MLX)
    file = repo.files["model.safetensors" if kind == "lfs" else "config.json"]
    if kind == "lfs":
        file.sha256 = file.etag = "../../../escape/B"
    else:
        file.blob_id = file.etag = "../../../escape/B"
    _pull_is_refused(capsys, loopback_hub, tmp_path, HOSTILE)
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize(
    "sibling",
    [
        {"size": 3},
        {"rfilename": "", "size": 3},
        {"rfilename": "dir/", "size": 3},
        {"rfilename": 7, "size": 3},
        {"rfilename": "a", "size": "big"},
        {"rfilename": "a", "size": -5},
        "not-a-dict",
        {"rfilename": "a", "size": 3, "lfs": {"sha256": 12}},
    ],
)
def test_a_malformed_listing_is_one_line(
    capsys, loopback_hub, hub_sources, tmp_path, monkeypatch, sibling
):
    """Today: KeyError / ValueError / TypeError tracebacks."""
    repo = loopback_hub.add(_gguf_repo(hub_sources.gguf.read_bytes()))
    info = repo.info
    monkeypatch.setattr(
        repo, "info", lambda: {**info(), "siblings": [*info()["siblings"], sibling]}
    )
    _pull_is_refused(capsys, loopback_hub, tmp_path, HOSTILE)


def test_the_app_s_path_is_refused_too(loopback_hub, hub_sources, tmp_path):
    """The window plans with client.plan / client.gguf_files and downloads with download.download:
    the same checks, and a plan made by hand is checked before anything is created."""
    loopback_hub.add(_gguf_repo(hub_sources.gguf.read_bytes(), name="../../../../escape/A.gguf"))
    with pytest.raises(HubError, match="outside"):
        client.plan(HOSTILE)
    with pytest.raises(HubError, match="outside"):
        client.gguf_files(HOSTILE)
    good = client.plan("gguf-org/Solo-GGUF")
    forged = client.RepoPlan(good.repo_id, "../../../../escape/C", good.kind, good.files, good.spec)
    with pytest.raises(HubError, match="commit id"):
        download.download(forged, data_root=tmp_path / "data")
    assert not hf_cache.repo_folder(good.repo_id).exists() and not (tmp_path / "escape").exists()


def test_the_checks_agree_with_huggingface_hub(tmp_path):
    """What huggingface_hub's own download refuses as a file name, we refuse, and what it
    takes, we take (its check runs before any request: offline here)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    names = [
        "model.gguf",
        "sub/dir/model.gguf",
        "./model.gguf",
        "a..b.gguf",
        "..a/b",
        "../x",
        "a/../../x",
        "/abs/x",
        "C:\\x",
        "C:x",
        "\\\\host\\share\\x",
        "a\\..\\..\\x",
        "d/C:x",
        "a/\\b",
    ]
    for name in names:
        try:
            hf_hub_download("org/name", name, cache_dir=tmp_path, local_files_only=True)
        except LocalEntryNotFoundError:
            theirs = True
        except ValueError:
            theirs = False
        try:
            client.check_repo_path(name, "org/name")
            ours = True
        except HubError:
            ours = False
        assert ours == theirs, name


def test_a_commit_id_is_what_huggingface_hub_takes_for_one():
    from huggingface_hub.file_download import REGEX_COMMIT_HASH

    from core.models.hub import names

    assert names.COMMIT_ID.pattern == REGEX_COMMIT_HASH.pattern
    assert names.is_commit_id("0123456789abcdef0123456789abcdef01234567")


# ---------------------------------------------------------------------------- search


QUANTIZED = {"parameters": {"U32": 125, "F16": 100}, "total": 225}  # 4-bit: 1,100 weights


@pytest.mark.parametrize(
    "card",
    [
        {"config": {"model_type": "llama", "quantization": {"bits": 0}}},
        {"config": {"model_type": "llama", "quantization": {"bits": -4}}},
        {"config": {"model_type": "llama", "quantization": {"bits": 64}}},
        {"config": {"model_type": "llama", "quantization": {"bits": True}}},
        {"config": {"model_type": "llama", "quantization": "4bit"}},
        {"config": {"model_type": ["llama"]}},
        {"config": "llama"},
        {"safetensors": {"parameters": {"F32": "many"}, "total": 1}},
        {"safetensors": {"parameters": {"F32": -10}, "total": -10}},
        {"safetensors": {"parameters": {"F32": 10**400}, "total": 1}},
        {"safetensors": {"parameters": {"F32": 1.5}, "total": 1}},
        {"safetensors": {"parameters": {"F32": None, 7: 3}, "total": 1}},
        {"downloads": "lots"},
        {"downloads": -3},
        {
            "tags": ["gguf"],
            "library_name": "gguf",
            "gguf": {"total": "many", "architecture": "llama"},
        },
        {"tags": ["gguf"], "library_name": "gguf", "gguf": {"total": -1, "architecture": 5}},
        {
            "tags": ["gguf"],
            "library_name": "gguf",
            "gguf": {"total": 1e300, "architecture": ["llama"]},
        },
    ],
)
def test_one_bad_search_result_costs_only_that_result(capsys, loopback_hub, tmp_path, card):
    """Today: `quantization.bits: 0` made the whole search fail with a division by zero
    (and the other cards with TypeErrors, or impossible figures): the good results are
    still listed, the bad one without its bad figures (or left out)."""
    fields = {
        "tags": ["mlx"],
        "library_name": "mlx",
        "safetensors": QUANTIZED,
        "config": {"model_type": "llama", "quantization": {"bits": 4, "group_size": 64}},
        **card,
    }
    repo = loopback_hub.add(HubRepo("tiny-evil/Tiny-Bad", {}, **{**fields, "downloads": 10_000}))
    if "downloads" in card:  # the loopback hub sorts by the number: only the card says otherwise
        card_of = repo.card
        repo.card = lambda: {**card_of(), "downloads": card["downloads"]}
    results = search("tiny", on_cpu=True, machine_bytes=16 * 2**30)
    ids = [r.repo_id for r in results]
    assert "mlx-community/Tiny-Llama-128" in ids and "gguf-org/Tiny-GGUF" in ids
    for r in results:
        assert r.parameters is None or (
            isinstance(r.parameters, int) and 0 < r.parameters < 10**15
        ), r
        assert r.size_bytes is None or (
            isinstance(r.size_bytes, int) and 0 < r.size_bytes < 10**16
        ), r
        assert isinstance(r.downloads, int) and r.downloads >= 0, r
        assert r.architecture is None or isinstance(r.architecture, str), r
        assert r.quantization is None or isinstance(r.quantization, str), r
    bad = next((r for r in results if r.repo_id == "tiny-evil/Tiny-Bad"), None)
    if bad is not None and "safetensors" not in card and bad.kind == "mlx":
        assert bad.parameters in (None, 1100)  # never 125 / 0 words of ... bits
    assert main(["search", "tiny", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mlx-community/Tiny-Llama-128" in out and "gguf-org/Tiny-GGUF" in out


def test_a_search_card_that_is_not_a_model_is_left_out(capsys, loopback_hub, tmp_path, monkeypatch):
    """A card huggingface_hub cannot read at all (no id): only that one is missing."""
    repo = loopback_hub.add(HubRepo("tiny-evil/Tiny-NoId", {}, downloads=10_000, tags=["mlx"]))
    original = repo.card
    repo.card = lambda: {k: v for k, v in original().items() if k not in ("id", "modelId")}
    assert main(["search", "tiny", "--data-dir", str(tmp_path)]) == 0
    assert "mlx-community/Tiny-Llama-128" in capsys.readouterr().out


def test_nothing_hostile_reaches_the_terminal(capsys, loopback_hub, hub_sources, tmp_path):
    name = "\x1b]0;pwned\x07/../../../../escape/A.gguf"
    loopback_hub.add(_gguf_repo(hub_sources.gguf.read_bytes(), name=name))
    err = _pull_is_refused(capsys, loopback_hub, tmp_path, HOSTILE)
    assert "\x1b" not in err and "\x07" not in err
