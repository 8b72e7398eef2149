"""Searching the hub and planning a download, against the loopback hub."""

from __future__ import annotations

import time

import pytest

from core.models import hub
from core.models.hub import ChooseFileError, HubError, OfflineError
from tests.core.models.hub_fixture import (
    BERT_MLX,
    BIG_MLX,
    GATED,
    GIANT_MLX,
    GOOD_TOKEN,
    MAMBA_GGUF,
    NO_WEIGHTS,
    ONE_GGUF,
    OTHER_MLX,
    PRIVATE,
    TINY_MLX,
    TWO_GGUF,
    free_port_url,
)

GB = 2**30


def test_search_lists_mlx_first_then_gguf_with_fits(loopback_hub, hub_sources):
    results = hub.search("tiny", on_cpu=True, machine_bytes=16 * GB)
    ids = [r.repo_id for r in results]
    # MLX before GGUF; mlx-community first, then by downloads; private repos never listed
    assert ids == [TINY_MLX, BIG_MLX, OTHER_MLX, GATED, TWO_GGUF]
    tiny = results[0]
    assert tiny.kind == "mlx" and tiny.architecture == "llama" and tiny.problem is None
    assert (
        tiny.parameters == hub_sources.parameters and tiny.size_bytes == 4 * hub_sources.parameters
    )
    assert tiny.fit.label == hub.FITS and tiny.fit.weights_bytes == 4 * hub_sources.parameters
    # a quarter of 16 GB is more than the cap
    assert tiny.fit.kv_pool_bytes == hub.KV_POOL_MAX_BYTES
    assert results[3].gated and not results[0].gated
    gguf = results[-1]
    assert gguf.kind == "gguf" and gguf.parameters == 448 and gguf.architecture == "llama"
    assert [q for q in ("mlx", "gguf") if ("GET", q)]  # both tags were asked for
    asked = [path for method, path in loopback_hub.requests if path.startswith("/api/models?")]
    assert any("filter=mlx" in p for p in asked) and any("filter=gguf" in p for p in asked)
    assert all("sort=downloads" in p for p in asked)


def test_search_fits_tight_and_wont_fit(loopback_hub):
    giant = hub.search("giant", on_cpu=False, machine_bytes=48 * GB)[0]
    assert giant.repo_id == GIANT_MLX and giant.quantization == "4bit"
    assert giant.parameters == 70_000_000_000 + 2_000_000_000  # U32 words hold 8 4-bit weights
    assert giant.size_bytes == 70_000_000_000 // 2 + 4_000_000_000  # on Metal: as stored
    assert giant.fit.label == hub.TIGHT  # 39 GB of 51.5 GB (48 GiB): tight
    assert hub.search("giant", on_cpu=False, machine_bytes=32 * GB)[0].fit.label == hub.WONT_FIT
    assert hub.search("giant", on_cpu=False, machine_bytes=128 * GB)[0].fit.label == hub.FITS
    on_cpu = hub.search("giant", on_cpu=True, machine_bytes=128 * GB)[0]
    assert on_cpu.fit.weights_bytes == 4 * 72_000_000_000 and on_cpu.fit.label == hub.WONT_FIT


def test_fit_estimate_and_kv_pool_follow_the_engine():
    from kvcache import pool

    assert hub.KV_POOL_MAX_BYTES == pool.DEFAULT_MAX_POOL_BYTES
    fit = hub.estimate_fit("gguf", 100 * 2**20, 135_000_000, on_cpu=True, machine_bytes=8 * GB)
    assert fit.weights_bytes == 540_000_000 and fit.kv_pool_bytes == 2 * GB - 540_000_000
    assert hub.kv_pool_bytes(3 * GB, 8 * GB) == 0  # past a quarter of memory: the minimum pool only


def test_gguf_architectures_match_the_import():
    from core.models.gguf_import import SUPPORTED_ARCHITECTURES

    assert hub.GGUF_ARCHITECTURES == SUPPORTED_ARCHITECTURES


def test_unsupported_families_are_shown_not_offered(loopback_hub):
    mamba = hub.search("mamba")[0]
    assert mamba.repo_id == MAMBA_GGUF and "can't map" in mamba.problem
    with pytest.raises(HubError, match="mamba family, which RadixChat's import can't map"):
        hub.plan(MAMBA_GGUF)
    # the hub did not say: the download reads config.json first
    assert hub.plan(BERT_MLX).architecture is None
    assert (
        hub.mlx_lm_supports("mistral")
        and hub.mlx_lm_supports("qwen3")
        and not hub.mlx_lm_supports("bert")
    )


def test_plan_takes_only_what_a_model_needs(loopback_hub):
    plan = hub.plan(TINY_MLX)
    assert (
        plan.kind == "mlx"
        and plan.spec == TINY_MLX
        and plan.commit == loopback_hub.repos[TINY_MLX].commit
    )
    assert sorted(f.path for f in plan.files) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    weights = next(f for f in plan.files if f.path == "model.safetensors")
    assert weights.sha256 == loopback_hub.repos[TINY_MLX].files["model.safetensors"].sha256


def test_repo_info_reads_what_hfapi_model_info_reads(loopback_hub):
    """plan() asks the hub itself (no HfApi import): same request, same files and hashes."""
    from huggingface_hub import HfApi

    for repo_id in (TINY_MLX, TWO_GGUF):
        info = HfApi(endpoint=hub.endpoint(), token=False).model_info(
            repo_id, revision="main", files_metadata=True
        )
        mine = hub.repo_info(repo_id)
        assert (
            mine["sha"] == info.sha
            and mine.get("config") == info.config
            and mine.get("gguf") == info.gguf
        )
        assert hub._repo_files(mine, repo_id) == [
            hub.RepoFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
            for s in info.siblings
        ]
    gets = [
        path for method, path in loopback_hub.requests if path.startswith(f"/api/models/{TWO_GGUF}")
    ]
    assert gets[-1] == gets[-2], gets  # the very request HfApi sends


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No token anywhere: not in the environment, no token file (in ``tmp_path``)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "token"


def test_token_is_the_one_huggingface_hub_finds(no_token, monkeypatch):
    """hub.token() reads the environment itself where the answer is certain and asks
    huggingface_hub's get_token otherwise: the same token (or none) either way."""
    from huggingface_hub import get_token

    assert hub.token() is None and get_token() is None
    for env in (
        {"HF_TOKEN": "hf_env"},
        {"HF_TOKEN": " hf_spaced\r\n"},
        {"HUGGING_FACE_HUB_TOKEN": "hf_old"},
        {"HF_TOKEN": "", "HUGGING_FACE_HUB_TOKEN": "hf_old"},
        {"HF_TOKEN": " \n"},
    ):
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            assert hub.token() == get_token(), env
    no_token.write_text("hf_file\n")  # `hf auth login`'s file: huggingface_hub reads it
    assert hub.token() == get_token() == "hf_file"
    monkeypatch.setenv("HF_TOKEN", "hf_env")  # the environment comes first
    assert hub.token() == get_token() == "hf_env"


@pytest.mark.parametrize("telemetry_off", [False, True])
def test_request_headers_are_build_hf_headers(no_token, monkeypatch, telemetry_off):
    """The headers of a request to the hub are huggingface_hub's own, user agent (with the
    AI agent its registry finds, unless telemetry is off) and token alike."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent, build_hf_headers

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", telemetry_off)
    monkeypatch.setattr(
        _detect_agent,
        "_registry",
        {
            "standardEnvVars": ["AI_AGENT"],
            "harnesses": {"radix-test": {"envVars": {"RADIX_TEST_AGENT": "*"}}},
        },
    )
    monkeypatch.setenv("RADIX_TEST_AGENT", "1")
    for token, origin in ((None, None), ("hf_secret", "studio")):
        if token:
            monkeypatch.setenv("HF_TOKEN", token)
        monkeypatch.setattr(constants, "HF_HUB_USER_AGENT_ORIGIN", origin)
        mine = hub.request_headers()
        assert mine == build_hf_headers(token=hub.token() or False, library_name="radixchat")
        assert ("agent/radix-test" in mine["user-agent"]) != telemetry_off
        assert mine.get("authorization") == (f"Bearer {token}" if token else None)


def test_mlx_lm_facts_read_without_importing_it():
    """The remapping read from mlx_lm/utils.py's source is mlx_lm's own; the machine's
    memory is psutil's figure."""
    import psutil
    from mlx_lm.utils import MODEL_REMAPPING

    assert hub._mlx_lm_remapping(hub._mlx_lm_folder()) == MODEL_REMAPPING
    assert hub.machine_memory_bytes() == psutil.virtual_memory().total


def test_gguf_repos_list_their_files(loopback_hub):
    with pytest.raises(ChooseFileError) as chosen:
        hub.plan(TWO_GGUF)
    # no split part, no vision projector
    assert sorted(f.path for f in chosen.value.choices) == ["tiny-F16.gguf", "tiny-Q8_0.gguf"]
    assert f"radixchat pull {TWO_GGUF}:" in str(chosen.value)
    assert [f.quantization for f in hub.gguf_files(TWO_GGUF)] == ["Q8_0", "F16"]  # smallest first
    one = hub.plan(TWO_GGUF, "tiny-Q8_0.gguf")
    assert one.kind == "gguf" and one.spec == f"{TWO_GGUF}:tiny-Q8_0.gguf" and len(one.files) == 1
    assert hub.plan(ONE_GGUF).spec == f"{ONE_GGUF}:solo-Q4_K_M.gguf"  # the only file


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (("nobody/nothing", None), "no model repo nobody/nothing on the hub"),
        (("not a repo", None), "is not a Hugging Face repo id"),
        (("../etc", None), "is not a Hugging Face repo id"),
        ((NO_WEIGHTS, None), "no weights RadixChat can use"),
        ((TWO_GGUF, "nope.gguf"), "has no file nope.gguf"),
        ((TINY_MLX, "config.json"), "only a .gguf file can be pulled on its own"),
        ((TWO_GGUF, "big/big-Q8_0-00001-of-00002.gguf"), "one part of a split GGUF"),
        ((TWO_GGUF, "mmproj-tiny-F16.gguf"), "a vision projector, not a language model"),
    ],
)
def test_bad_input_is_one_line(loopback_hub, target, message):
    with pytest.raises(HubError, match=message) as raised:
        hub.plan(*target)
    assert "\n" not in str(raised.value)


def test_private_repo_needs_a_token(loopback_hub, monkeypatch):
    with pytest.raises(HubError, match="if it is private, set HF_TOKEN"):
        hub.plan(PRIVATE)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert hub.plan(PRIVATE).kind == "mlx"


def test_offline_says_so_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", free_port_url())  # nothing listens there
    started = time.monotonic()
    with pytest.raises(OfflineError, match="offline: can't reach the Hugging Face hub") as raised:
        hub.search("qwen")
    with pytest.raises(OfflineError):
        hub.plan(TINY_MLX)
    assert time.monotonic() - started < 2 * hub.PROBE_TIMEOUT and "\n" not in str(raised.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE is set"):
        hub.search("qwen")


def test_empty_search_says_what_to_do(loopback_hub):
    with pytest.raises(HubError, match="search for something"):
        hub.search("  ")
    assert hub.search("zzz-nothing-matches") == []


def test_quantization_from_names():
    assert hub.quantization_of("Llama-3.2-3B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert hub.quantization_of("model.IQ3_XS.gguf") == "IQ3_XS"
    assert hub.quantization_of("mlx-community/Qwen3-4B-8bit") == "8bit"
    assert hub.quantization_of("org/plain-model") is None
