"""``radixchat bench cpu`` on a tiny generated model: both OpenBLAS children, four formats."""

from __future__ import annotations

import json

from bench.cpu import FORMATS, make_prompt
from core.cli.main import EXIT_USER_ERROR, main
from core.models.tiny_model import build_tokenizer, write_tiny_model


def test_bench_cpu_json_has_every_setup(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "cpu",
        "--model",
        str(path),
        "--repeats",
        "1",
        "--prompt-tokens",
        "16",
        "--decode-tokens",
        "4",
        "--json",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)

    assert report["model"] == str(path)
    assert report["machine"]["cpu_count"] >= 1
    results = report["results"]
    assert len(results) == 8
    assert {(r["openblas"], r["weights"]) for r in results} >= {(False, f) for f in FORMATS}
    for r in results:
        assert r["prefill_tps"] > 0 and r["decode_tps"] > 0
        assert r["load_s"] > 0 and r["weight_bytes"] > 0
        assert len(r["prefill_tps_all"]) == len(r["decode_tps_all"]) == 1
    by_format = {r["weights"]: r["weight_bytes"] for r in results if not r["openblas"]}
    assert by_format["float16"] == by_format["bfloat16"] == by_format["float32"] // 2
    assert report["auto_choice"] in FORMATS
    assert report["best_decode"]["weights"] in FORMATS


def test_bad_model_is_a_user_error(tmp_path, capsys):
    argv = ["bench", "cpu", "--model", str(tmp_path / "nope"), "--data-dir", str(tmp_path)]
    assert main(argv) == EXIT_USER_ERROR
    assert "no model at" in capsys.readouterr().err


def test_prompt_has_exactly_the_asked_tokens():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer())
    assert len(make_prompt(tokenizer, 300)) == 300
    assert make_prompt(tokenizer, 5) == make_prompt(tokenizer, 5)


def test_bench_cpu_table(tmp_path, capsys):
    path = write_tiny_model(tmp_path / "tiny")
    argv = [
        "bench",
        "cpu",
        "--model",
        str(path),
        "--repeats",
        "1",
        "--prompt-tokens",
        "8",
        "--decode-tokens",
        "2",
        "--data-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"model: {path}" and lines[1].startswith("machine: ") and "CPUs" in lines[1]
    assert lines[3].split() == [
        "setup",
        "load",
        "s",
        "weights",
        "MB",
        "prefill",
        "tok/s",
        "/best",
        "/base",
        "decode",
        "tok/s",
        "/best",
        "/base",
    ]
    rows = lines[5:13]
    assert {" ".join(row.split()[:3]) for row in rows} >= {f"ref-blas + {f}" for f in FORMATS}
    assert all(len(row.split()) == 11 for row in rows)  # the label's three words and eight figures
    assert any(line.startswith("best prefill: ") for line in lines)
    assert any(line.startswith("best overall (both ratios multiplied): ") for line in lines)
    assert lines[-1].startswith("`auto` picks on this machine: ") and "OpenBLAS" in lines[-1]
