"""What runs before any group starts: which models split, the hostfile, the wire format,
and ``radixchat serve --hosts`` refusing a model it cannot split in one line."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from core.cli.main import main
from core.distributed.launch import launch_command, read_hostfile
from core.distributed.shard import (
    UnsplittableModel,
    model_config,
    rank_cache_name,
    rank_fingerprint,
    split_plan,
)
from core.distributed.wire import (
    ChannelClosed,
    recv_message,
    request_from_dict,
    request_to_dict,
    send_message,
)
from core.engine.types import ChatMessage, GenerationRequest, SamplingParams, ToolCall
from core.errors import UserError
from core.models.tiny_model import TinyModelSpec, write_tiny_model


def test_a_llama_splits_when_its_heads_divide():
    config = {
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
    }
    plan = split_plan(config, 2, "m")
    assert (plan.heads, plan.kv_heads, plan.world) == (4, 2, 2)
    with pytest.raises(UnsplittableModel, match="its 2 KV heads do not divide by 4"):
        split_plan({**config, "num_attention_heads": 8}, 4, "m")


def test_the_default_models_shape_is_refused_over_two():
    # SmolLM2-135M: 9 heads, 3 KV heads
    with pytest.raises(UnsplittableModel, match="its 9 attention heads do not divide by 2"):
        split_plan(
            {"model_type": "llama", "num_attention_heads": 9, "num_key_value_heads": 3},
            2,
            "SmolLM2",
        )


@pytest.mark.parametrize("model_type", ["gemma3_text", "no_such_model"])
def test_an_architecture_without_a_split_is_refused(model_type):
    with pytest.raises(
        UnsplittableModel,
        match=f"no tensor-parallel or pipeline split for model type '{model_type}'",
    ):
        split_plan(
            {"model_type": model_type, "num_attention_heads": 4, "num_key_value_heads": 2}, 2, "m"
        )


def test_a_model_only_mlx_lm_pipelines_runs_pipelined():
    config = {
        "model_type": "qwen3_next",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
    }
    plan = split_plan(config, 2, "m")
    assert (plan.method, plan.layers) == ("pipeline", 4)
    assert plan.describe() == "pipelined: 2 of 4 layers each"
    assert (
        split_plan({**config, "num_hidden_layers": 5}, 2, "m").describe()
        == "pipelined: 2 or 3 of 5 layers each"
    )
    with pytest.raises(
        UnsplittableModel, match="no tensor-parallel split for model type 'qwen3_next'"
    ):
        split_plan(config, 2, "m", "tensor")
    with pytest.raises(
        UnsplittableModel, match="cannot be pipelined over 8 machines: it has only 4 layers"
    ):
        split_plan(config, 8, "m")


def test_a_model_with_both_splits_takes_tensor_unless_asked_or_its_heads_do_not_divide():
    config = {
        "model_type": "qwen2",
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
    }
    assert split_plan(config, 2, "m").method == "tensor"
    assert split_plan(config, 2, "m", "pipeline").method == "pipeline"
    assert split_plan(config, 3, "m").method == "pipeline"  # 4 heads do not divide by 3
    with pytest.raises(UnsplittableModel, match="its 4 attention heads do not divide by 3$"):
        split_plan(config, 3, "m", "tensor")


def test_a_model_mlx_lm_cannot_pipeline_is_refused_when_asked():
    # llama: tensor parallel only; the default SmolLM2 (9 heads) then has no split over 2 at all
    with pytest.raises(
        UnsplittableModel,
        match="cannot run pipelined: mlx-lm has no pipeline split for model type 'llama'",
    ):
        split_plan(
            {"model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 4},
            2,
            "m",
            "pipeline",
        )
    with pytest.raises(
        UnsplittableModel, match="do not divide by 2 \\(and mlx-lm has no pipeline split for it\\)"
    ):
        split_plan(
            {
                "model_type": "llama",
                "num_attention_heads": 9,
                "num_key_value_heads": 3,
                "num_hidden_layers": 30,
            },
            2,
            "SmolLM2",
        )


def test_serve_hosts_refuses_an_unsplittable_model_before_launching(tmp_path, capsys):
    model = write_tiny_model(tmp_path / "gemma", TinyModelSpec(kind="sliding", num_layers=2))
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    code = main(
        [
            "serve",
            "--hosts",
            str(hosts),
            "--model",
            str(model),
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "cannot run over several machines" in err[0] and "gemma3_text" in err[0]


def test_model_config_reads_only_the_config(tmp_path):
    model = write_tiny_model(tmp_path / "m", TinyModelSpec())
    (model / "model.safetensors").write_bytes(b"not weights")  # never read
    assert model_config(model)["num_key_value_heads"] == 2


def test_each_rank_has_its_own_fingerprint_and_store():
    prints = {
        rank_fingerprint("abc", r, w, split)
        for r, w in [(0, 2), (1, 2), (0, 4), (1, 4)]
        for split in ("tensor", "pipeline")
    }
    assert len(prints) == 8 and "abc" not in prints
    assert rank_cache_name(1, 2) != rank_cache_name(0, 2)


def test_the_hostfile_is_checked(tmp_path):
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": "a", "ips": ["10.0.0.1"]}]))
    with pytest.raises(UserError, match="a group needs at least 2"):
        read_hostfile(path)
    path.write_text(json.dumps({"hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]}))
    with pytest.raises(UserError, match="no IP for b"):
        read_hostfile(path)
    path.write_text("[{")
    with pytest.raises(UserError, match="not readable JSON"):
        read_hostfile(path)
    path.write_text(
        json.dumps([{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}])
    )
    hosts = read_hostfile(path)
    command = launch_command(path, hosts, ["--model", "m"])
    assert command[command.index("--backend") + 1] == "ring"
    assert command[-4:] == ["serve", "--model", "m", "--group-member"]


def test_a_request_crosses_the_wire_unchanged():
    request = GenerationRequest(
        messages=(
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "", (ToolCall("c1", "f", '{"a": 1}'),)),
            ChatMessage("tool", "42", tool_call_id="c1", name="f"),
        ),
        sampling=SamplingParams(temperature=0.3, seed=7, max_tokens=9, stop=("\n\n",)),
        session="s",
        tools=({"type": "function", "function": {"name": "f", "parameters": {}}},),
        tool_choice="function",
        tool_name="f",
        json_schema={"type": "object"},
    )
    assert request_from_dict(json.loads(json.dumps(request_to_dict(request)))) == request
    tokens = GenerationRequest(prompt_tokens=(1, 2, 3), use_cache=False)
    assert request_from_dict(json.loads(json.dumps(request_to_dict(tokens)))) == tokens
    # Ollama's context (issue 43) and a template variable
    turn = GenerationRequest(
        prompt_text="and", context_tokens=(4, 5), template_kwargs={"enable_thinking": False}
    )
    assert request_from_dict(json.loads(json.dumps(request_to_dict(turn)))) == turn


def test_messages_are_framed_and_a_closed_peer_is_seen():
    a, b = socket.socketpair()
    with a, b:
        sender = threading.Thread(
            target=lambda: [send_message(a, {"op": "tick", "n": i}) for i in range(3)]
        )
        sender.start()
        assert [recv_message(b)["n"] for _ in range(3)] == [0, 1, 2]
        sender.join()
        a.close()
        with pytest.raises(ChannelClosed):
            recv_message(b)


def test_rank_0_stops_the_group_when_a_rank_ends_a_request_otherwise(tmp_path):
    from core.distributed.engine import ShardedEngine
    from core.distributed.group import LeaderChannel, Membership, _Faults

    reports = []
    channel = LeaderChannel.__new__(LeaderChannel)  # no sockets: only its fault reporting is used
    channel.member = Membership(0, 2, ("studio", "macbook"))
    channel.faults = _Faults(reports.append)
    engine = ShardedEngine(tmp_path, channel.member, None, channel, model_spec=None)
    channel.on_message(1, {"op": "outcome", "id": 1, "outcome": "stop 5 tokens ab"})  # rank 1 first
    engine._compare(1, 1, "stop 5 tokens ab")
    engine._compare(1, 2, "length 9 tokens cd")  # rank 0 first
    channel.on_message(1, {"op": "outcome", "id": 2, "outcome": "length 9 tokens ce"})
    assert reports == [
        "rank 1 (macbook) is out of step with rank 0 (request 2 ended 'length 9 tokens ce' "
        "on one, 'length 9 tokens cd' on the other)"
    ]
    assert engine._outcomes == {}
