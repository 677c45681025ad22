"""A weights file read whole from one checked descriptor (issue 57): the tensors equal what
safetensors itself reads, every dtype; a header whose entries do not fit the bytes, a file
that is not a regular file, and a file opened through a link to outside the root are refused
with one line naming the file."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from areal_m2po.rollout.common.weight_reader import header_shapes, read_safetensors

STATE = {
    "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
    "bf16": torch.linspace(-2, 2, 5).to(torch.bfloat16),
    "f16": torch.tensor([[0.5, -1.25], [3.0, 65504.0]], dtype=torch.float16),
    "i64": torch.tensor([-(2**40), 0, 7]),
    "u8": torch.tensor([0, 255, 17], dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "scalar": torch.tensor(3.5),
    "empty": torch.zeros(0, 3),
}


def test_the_tensors_are_those_safetensors_reads(tmp_path):
    path = str(tmp_path / "m.safetensors")
    save_file(STATE, path, metadata={"weight_version": "4"})
    read = read_safetensors(path, str(tmp_path))
    reference = load_file(path)
    assert read.metadata["weight_version"] == "4"
    assert sorted(read.tensors) == sorted(reference)
    for name, tensor in reference.items():
        got = read.tensors[name]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
        assert torch.equal(got, tensor), name
    assert header_shapes(path) == {k: tuple(v.shape) for k, v in STATE.items()}
    assert read.real_path == os.path.realpath(path)


def _file_with_header(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"dtype": "F32", "shape": [4], "data_offsets": [0, 32]}, "does not fit the file's bytes"),
        ({"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}, "does not fit the file's bytes"),
        ({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}, "does not fit the file's bytes"),
        ({"dtype": "X9", "shape": [4], "data_offsets": [0, 16]}, "has a malformed header entry"),
        ({"dtype": "F32", "shape": [4]}, "has a malformed header entry"),
    ],
    ids=["past-the-end", "wrong-size", "negative-shape", "unknown-dtype", "no-offsets"],
)
def test_a_header_entry_that_does_not_fit_is_refused(tmp_path, entry, message):
    path = str(tmp_path / "m.safetensors")
    _file_with_header(path, {"w": entry}, b"\0" * 16)
    with pytest.raises(ValueError, match=f"m.safetensors: tensor 'w' {message}"):
        read_safetensors(path)


def test_a_fifo_and_a_link_outside_the_root_are_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    fifo = root / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        read_safetensors(str(fifo), str(root))  # answered at once: never blocks on the pipe
    outside = str(tmp_path / "outside.safetensors")
    save_file(STATE, outside)
    link = root / "link.safetensors"
    os.symlink(outside, link)
    with pytest.raises(PermissionError, match="resolves outside the server's --weights-root"):
        read_safetensors(str(link), str(root))
    cut = root / "cut.safetensors"
    save_file(STATE, str(cut))
    os.truncate(cut, os.path.getsize(cut) - 8)
    with pytest.raises(ValueError, match="does not fit the file's bytes"):
        read_safetensors(str(cut), str(root))
