"""The hub client: a repo's files and planning a download, against the loopback hub."""

from __future__ import annotations

import time

import pytest

from core.models.hub import client
from core.models.hub.client import ChooseFileError, HubError, OfflineError
from core.models.hub.search import search
from tests.core.models.hub.hub_fixture import (
    BERT_MLX,
    GOOD_TOKEN,
    MAMBA_GGUF,
    NO_WEIGHTS,
    ONE_GGUF,
    PRIVATE,
    TINY_MLX,
    TWO_GGUF,
    free_port_url,
)

GB = 2**30


def test_unsupported_families_are_not_offered(loopback_hub):
    with pytest.raises(HubError, match="mamba family, which RadixChat's import can't map"):
        client.plan(MAMBA_GGUF)
    # the hub did not say: the download reads config.json first
    assert client.plan(BERT_MLX).architecture is None
    assert (
        client.mlx_lm_supports("mistral")
        and client.mlx_lm_supports("qwen3")
        and not client.mlx_lm_supports("bert")
    )


def test_plan_takes_only_what_a_model_needs(loopback_hub):
    plan = client.plan(TINY_MLX)
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
        info = HfApi(endpoint=client.endpoint(), token=False).model_info(
            repo_id, revision="main", files_metadata=True
        )
        mine = client.repo_info(repo_id)
        assert (
            mine["sha"] == info.sha
            and mine.get("config") == info.config
            and mine.get("gguf") == info.gguf
        )
        assert client._repo_files(mine, repo_id) == [
            client.RepoFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, s.blob_id)
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
    """client.token() reads the environment itself where the answer is certain and asks
    huggingface_hub's get_token otherwise: the same token (or none) either way."""
    from huggingface_hub import get_token

    assert client.token() is None and get_token() is None
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
            assert client.token() == get_token(), env
    no_token.write_text("hf_file\n")  # `hf auth login`'s file: huggingface_hub reads it
    assert client.token() == get_token() == "hf_file"
    monkeypatch.setenv("HF_TOKEN", "hf_env")  # the environment comes first
    assert client.token() == get_token() == "hf_env"


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
        mine = client.request_headers()
        assert mine == build_hf_headers(token=client.token() or False, library_name="radixchat")
        assert ("agent/radix-test" in mine["user-agent"]) != telemetry_off
        assert mine.get("authorization") == (f"Bearer {token}" if token else None)


def test_mlx_lm_remapping_read_without_importing_it():
    """The remapping read from mlx_lm/utils.py's source is mlx_lm's own."""
    from mlx_lm.utils import MODEL_REMAPPING

    assert client._mlx_lm_remapping(client._mlx_lm_folder()) == MODEL_REMAPPING


def test_gguf_repos_list_their_files(loopback_hub):
    taken = client.plan(TWO_GGUF)  # no Q4_K_M: the smallest that fits, said so
    assert taken.spec == f"{TWO_GGUF}:tiny-Q8_0.gguf"
    assert taken.note == (
        f"{TWO_GGUF} has 2 GGUF files: taking tiny-Q8_0.gguf (the smallest that fits this "
        f"machine); name another as {TWO_GGUF}:FILE"
    )
    with pytest.raises(ChooseFileError) as chosen:
        client.plan(TWO_GGUF, machine_bytes=1000)  # none fits: the user chooses
    # no split part, no vision projector
    assert sorted(f.path for f in chosen.value.choices) == ["tiny-F16.gguf", "tiny-Q8_0.gguf"]
    assert f"radixchat pull {TWO_GGUF}:" in str(chosen.value)
    assert "none of the 2 GGUF files" in str(chosen.value)
    # smallest first
    assert [f.quantization for f in client.gguf_files(TWO_GGUF)] == ["Q8_0", "F16"]
    one = client.plan(TWO_GGUF, "tiny-Q8_0.gguf")
    assert one.kind == "gguf" and one.spec == f"{TWO_GGUF}:tiny-Q8_0.gguf" and len(one.files) == 1
    assert client.plan(ONE_GGUF).spec == f"{ONE_GGUF}:solo-Q4_K_M.gguf"  # the only file


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
        client.plan(*target)
    assert "\n" not in str(raised.value)


def test_private_repo_needs_a_token(loopback_hub, monkeypatch):
    with pytest.raises(HubError, match="if it is private, set HF_TOKEN"):
        client.plan(PRIVATE)
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    assert client.plan(PRIVATE).kind == "mlx"


def test_offline_says_so_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", free_port_url())  # nothing listens there
    started = time.monotonic()
    with pytest.raises(OfflineError, match="offline: can't reach the Hugging Face hub") as raised:
        search("qwen")
    with pytest.raises(OfflineError):
        client.plan(TINY_MLX)
    assert time.monotonic() - started < 2 * client.PROBE_TIMEOUT and "\n" not in str(raised.value)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE is set"):
        search("qwen")


def test_quantization_from_names():
    assert client.quantization_of("Llama-3.2-3B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert client.quantization_of("model.IQ3_XS.gguf") == "IQ3_XS"
    assert client.quantization_of("mlx-community/Qwen3-4B-8bit") == "8bit"
    assert client.quantization_of("org/plain-model") is None


def test_the_default_quantization_is_q4_k_m_else_the_smallest_that_fits():
    def file(path: str, size: int) -> client.RepoFile:
        return client.RepoFile(path, size, None, "0" * 40)

    files = (
        file("m-Q2_K.gguf", 300 * 2**20),
        file("m-Q4_K_M.gguf", 500 * 2**20),
        file("m-Q8_0.gguf", 900 * 2**20),
    )
    chosen, why = client.default_gguf(files, on_cpu=False, machine_bytes=64 * 2**30)
    assert chosen.path == "m-Q4_K_M.gguf" and why == "Q4_K_M, the usual balance"
    chosen, why = client.default_gguf(files[::2], on_cpu=False, machine_bytes=64 * 2**30)
    assert chosen.path == "m-Q2_K.gguf" and why == "the smallest that fits this machine"
    big = (file("m-Q8_0.gguf", 900 * 2**20), file("m-F16.gguf", 1800 * 2**20))
    chosen, _ = client.default_gguf(big, on_cpu=False, machine_bytes=2 * 2**30)
    assert chosen.path == "m-Q8_0.gguf"  # F16 does not fit 2 GB
    assert client.default_gguf(big, on_cpu=False, machine_bytes=2**20) is None
