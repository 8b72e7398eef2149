"""The one GGUF header parser: checked against the ``gguf`` package's own reader."""

from __future__ import annotations

import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

from core.errors import ModelLoadError
from core.models.load.gguf_header import read_header

T = gguf.GGMLQuantizationType


def write_gguf(path, alignment: int | None = None):
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.data_alignment = alignment
        writer.add_custom_alignment(alignment)
    writer.add_block_count(1)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_token_list(["a", "bb", "<s>"] * 100)
    writer.add_array("test.nested", [[1, 2], [3, 4, 5]])
    writer.add_tensor("token_embd.weight", np.arange(16 * 8, dtype=np.float32).reshape(16, 8))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), dtype=np.float16))
    q = gguf.quants.quantize(np.ones((4, 64), dtype=np.float32), T.Q8_0)
    writer.add_tensor("output.weight", q, raw_dtype=T.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64])
def test_header_agrees_with_the_gguf_package(tmp_path, alignment):
    path = write_gguf(tmp_path / "m.gguf", alignment)
    header = read_header(path)
    reference = gguf.GGUFReader(str(path))
    assert [t.name for t in header.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(header.tensors, reference.tensors):
        assert mine.ggml_type == theirs.tensor_type
        assert mine.offset == theirs.data_offset and mine.nbytes == theirs.n_bytes
        assert int(np.prod(mine.shape)) == int(theirs.n_elements)
    assert header.tensors[0].shape == (16, 8)  # rows first
    raw = np.fromfile(path, dtype=np.uint8)[header.tensors[0].offset :][: header.tensors[0].nbytes]
    assert np.array_equal(
        raw.view("<f4").reshape(16, 8), np.arange(16 * 8, dtype=np.float32).reshape(16, 8)
    )
    assert header.metadata["tokenizer.ggml.tokens"][:3] == ["a", "bb", "<s>"]
    assert header.metadata["test.nested"] == [[1, 2], [3, 4, 5]]
    assert header.metadata["llama.rope.freq_base"] == 10000.0
    assert header.metadata["general.architecture"] == "llama"
    assert header.parameter_count() == 16 * 8 + 8 * 8 + 4 * 64
    assert not header.mlx_reads_exactly() or all(
        t.ggml_type in (T.F32, T.F16, T.Q8_0) for t in header.tensors
    )


@pytest.mark.parametrize("alignment", [None, 64])
def test_without_metadata_the_tensor_directory_is_the_same(tmp_path, alignment):
    path = write_gguf(tmp_path / "m.gguf", alignment)
    full, bare = read_header(path), read_header(path, metadata=False)
    assert bare.tensors == full.tensors
    assert bare.metadata == ({} if alignment is None else {"general.alignment": alignment})


def _with_version(path, version):
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, version)
    path.write_bytes(bytes(data))


def test_version_1_is_refused(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    _with_version(path, 1)
    with pytest.raises(ModelLoadError, match="version 1 is not supported"):
        read_header(path)


def test_a_header_without_tensors_reads_as_empty(tmp_path):
    """The importer says what that means ("holds no model"); the picker estimates from the size."""
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    assert read_header(path).tensors == () and read_header(path).parameter_count() == 0


@pytest.mark.parametrize("metadata", [True, False])
def test_damaged_files_raise_one_clear_error(tmp_path, metadata):
    path = write_gguf(tmp_path / "m.gguf")
    data = path.read_bytes()
    last = read_header(path).tensors[-1]
    for name, body in [
        ("cut-vocab", data[:200]),
        ("cut-data", data[: last.offset + last.nbytes - 1]),
        ("junk", b"not a model" * 10),
        ("empty", b""),
    ]:
        (tmp_path / name).write_bytes(body)
        with pytest.raises(ModelLoadError, match="not a readable GGUF file"):
            read_header(tmp_path / name, metadata=metadata)


def test_reading_a_header_does_not_import_mlx():
    code = (
        "import sys, core.models.load.gguf_header, core.models.catalog; print('mlx' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_header_errors(tmp_path):
    path = tmp_path / "not.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        read_header(path)
