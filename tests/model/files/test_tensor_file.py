import json
import math
import struct

import numpy as np
import pytest
import torch

from model.files import tensor_file
from pipeline.errors import PipelineError


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_tree_roundtrip_keeps_every_type(tmp_path):
    tree = {
        "config": {"lr": 2e-4, "betas": (0.9, 0.999), "name": "x", "on": True, "none": None},
        "by_index": {0: torch.arange(3), 7: {"step": torch.tensor(5.0)}},
        "tagged_lookalike": {"__tensor__": "not a tensor", "__tuple__": [1]},
        "floats": [float("nan"), float("inf"), -float("inf"), 1.5],
        "big": 2**100,
        "rng": torch.ByteTensor(list(range(16))),
        "half": torch.ones(2, 3, dtype=torch.float16),
        "scalar": torch.tensor(3, dtype=torch.int64),
    }
    tensor_file.save(tmp_path / "t.safetensors", tree, "fmt-1")
    fmt, back = tensor_file.load(tmp_path / "t.safetensors", "fmt-1")
    assert fmt == "fmt-1" and _same(tree, back)


def test_numpy_values_come_back_as_tensors_and_numbers(tmp_path):
    tensor_file.save(tmp_path / "n", {"a": np.arange(4, dtype=np.float32),
                                      "b": np.float64(0.25)}, "f")
    _, back = tensor_file.load(tmp_path / "n", "f")
    assert torch.equal(back["a"], torch.arange(4, dtype=torch.float32)) and back["b"] == 0.25


def test_optimizer_state_resumes_exactly(tmp_path):
    """An AdamW state through the file continues with the same update as in memory."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([w], lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        (w ** 2).sum().backward()
        opt.step()
    tensor_file.save(tmp_path / "o", {"opt": opt.state_dict(), "w": w.data}, "f")
    _, back = tensor_file.load(tmp_path / "o", "f")
    w2 = torch.nn.Parameter(back["w"].clone())
    opt2 = torch.optim.AdamW([w2], lr=0.1)
    opt2.load_state_dict(back["opt"])
    for o, p in ((opt, w), (opt2, w2)):
        o.zero_grad()
        (p ** 2).sum().backward()
        o.step()
    assert torch.equal(w, w2)


def test_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    tensor_file.save(path, {"x": torch.ones(1)}, "f")
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", boom)
    with pytest.raises(OSError):
        tensor_file.save(path, {"x": torch.zeros(1)}, "f")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [
        "m.safetensors"]


def test_objects_that_are_not_data_are_not_written(tmp_path):
    with pytest.raises(TypeError, match="cannot store"):
        tensor_file.save(tmp_path / "x", {"f": print}, "f")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("content, message", [
    (b"PK\x03\x04rest of a zip", "old pickle format"),
    (b"\x80\x04\x95 a pickle", "regrab-models convert"),
    (struct.pack("<Q", 2**60) + b"{}", "unreadable"),
    (b"short", "unreadable"),
])
def test_refuses_what_is_not_a_tensor_file(tmp_path, content, message):
    (tmp_path / "bad").write_bytes(content)
    with pytest.raises(PipelineError, match=message) as exc:
        tensor_file.load(tmp_path / "bad", "f")
    assert "\n" not in str(exc.value)


def _raw_file(path, meta: dict, tensors_json: dict | None = None):
    header = json.dumps({"__metadata__": meta, **(tensors_json or {})}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


@pytest.mark.parametrize("tree, message", [
    ("[" * 5000 + "]" * 5000, "unreadable|nested"),
    ("[1, 2]", "no data tree"),
    ('{"w": {"__tensor__": "9"}}', "tensor '9' is missing"),
    ('{"w": {"__tensor__": [1]}}', "is missing"),
    ('{"x": {"__float__": "1e999999"}}', "malformed"),
    ('{"d": {"__dict__": [[[1], 2]]}}', "malformed"),
    ("not json", "unreadable"),
])
def test_hostile_metadata_is_refused_in_one_line(tmp_path, tree, message):
    path = _raw_file(tmp_path / "h", {"format": "f", "tree": tree})
    with pytest.raises(PipelineError, match=message) as exc:
        tensor_file.load(path, "f")
    assert "\n" not in str(exc.value)


def test_other_format_is_refused(tmp_path):
    path = _raw_file(tmp_path / "o", {"format": "g", "tree": "{}"})
    with pytest.raises(PipelineError, match="format 'g', want f"):
        tensor_file.load(path, "f")


@pytest.mark.parametrize("size", [0x80, 0x180, 0x280])
def test_header_sizes_that_start_like_a_pickle_still_load(tmp_path, size):
    """A header of 0x80 + 256 k bytes starts with the byte of a pickle's PROTO opcode."""
    path = tmp_path / "t"
    for pad in range(800):
        tensor_file.save(path, {"s": "x" * pad}, "f")
        if int.from_bytes(path.read_bytes()[:8], "little") == size:
            break
    else:
        pytest.skip("no padding gave that header size")
    assert path.read_bytes()[:1] == b"\x80"
    assert tensor_file.load(path, "f")[1]["s"] == "x" * pad


def test_the_same_tree_gives_the_same_bytes_in_every_process(tmp_path):
    """The library orders the header's metadata by a per-process hash; the header is
    rewritten in one order, so a rerun writes the same file (and DVC sees no change)."""
    import subprocess
    import sys

    script = ("import sys, torch; from model.files import tensor_file; "
              "tensor_file.save(sys.argv[1], {'w': torch.arange(6.).view(2, 3), 'e': "
              "torch.zeros(0), 'meta': {'name': 'é', 'steps': [1, 2]}, 'b': torch.ones(2, "
              "dtype=torch.long)}, 'fmt'); tensor_file.save_tensors(sys.argv[2], "
              "{'b': torch.ones(3), 'a': torch.zeros(2, dtype=torch.long)})")
    # Four children at once: each spends its time importing torch.
    children = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / f"t{i}"),
                                  str(tmp_path / f"p{i}")]) for i in range(4)]
    assert [child.wait(timeout=300) for child in children] == [0, 0, 0, 0]
    for stem in ("t", "p"):
        files = {(tmp_path / f"{stem}{i}").read_bytes() for i in range(4)}
        assert len(files) == 1, stem
    fmt, tree = tensor_file.load(tmp_path / "t0", "fmt")
    assert tree["meta"] == {"name": "é", "steps": [1, 2]} and tree["w"].shape == (2, 3)
    assert torch.equal(tensor_file.load_tensors(tmp_path / "p0", "w", "fix")["b"], torch.ones(3))
    head = (tmp_path / "t0").read_bytes()
    size = int.from_bytes(head[:8], "little")
    assert size % 8 == 0 and json.loads(head[8:8 + size])["__metadata__"]["format"] == "fmt"
