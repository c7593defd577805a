"""The checkpoint checks (module_utils/sglang/checkpoint.py) against the real ``safetensors`` package.

The real package (``safetensors`` 0.8.0, in the differential venv next to SGLang's dependencies) writes the
checkpoints, in every dtype SGLang loads, and judges the damaged ones with its own reader (``safe_open`` and
reading every tensor, as SGLang's weight iterator does). The collection's header-only reader must agree:
the same tensors, dtypes and shapes for a good file, and a refusal exactly where the real reader fails.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import env  # noqa: E402

from ansible_collections.gpufleet.sglang.plugins.module_utils.sglang import checkpoint as ck  # noqa: E402

WRITE = r"""
import json, sys
import numpy as np
from safetensors.numpy import save_file
spec = json.loads(sys.argv[2])
tensors = {}
for name, (dtype, shape) in spec.items():
    tensors[name] = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
save_file(tensors, sys.argv[1], metadata={"format": "np"})
"""

JUDGE = r"""
import json, sys
from safetensors import safe_open
out = {}
for path in sys.argv[1:]:
    try:
        with safe_open(path, framework="numpy") as f:
            layout = {}
            for key in f.keys():
                t = f.get_tensor(key)
                layout[key] = [str(t.dtype), list(t.shape)]
        out[path] = {"ok": True, "layout": layout}
    except Exception as exc:
        out[path] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
print(json.dumps(out))
"""

NUMPY_TO_SAFETENSORS = {"float16": "F16", "float32": "F32", "float64": "F64", "int8": "I8", "int16": "I16",
                        "int32": "I32", "int64": "I64", "uint8": "U8", "bool": "BOOL"}

SPEC = {"embed.weight": ["float16", [64, 8]], "layers.0.w": ["float32", [8, 8]], "layers.0.b": ["int64", [8]],
        "mask": ["bool", [3, 5]], "scale": ["float64", []], "q": ["int8", [2, 3, 4]], "u": ["uint8", [9]]}


@pytest.fixture(scope="module")
def venv_python():
    env.ensure_venv()
    return str(env.VENV / "bin" / "python")


def _run(python, script, *args):
    proc = subprocess.run([python, "-c", script] + list(args), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_header_reader_agrees_with_safetensors_on_its_own_files(venv_python, tmp_path):
    path = tmp_path / "model.safetensors"
    _run(venv_python, WRITE, str(path), json.dumps(SPEC))
    real = json.loads(_run(venv_python, JUDGE, str(path)))[str(path)]
    assert real["ok"], real
    ours = ck.tensors_of(str(path))
    assert set(ours) == set(real["layout"]) == set(SPEC)
    for name, (dtype, shape) in real["layout"].items():
        assert ours[name] == (NUMPY_TO_SAFETENSORS[dtype], tuple(shape)), name


def _shift_first_range(data, header_len):
    """The header with its first tensor's range moved by one element (same length: the header keeps its size)."""
    header = json.loads(data[8:8 + header_len])
    name = sorted(k for k in header if k != "__metadata__")[0]
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin + 1, end + 1]
    raw = json.dumps(header).encode()
    raw = raw + b" " * (header_len - len(raw)) if len(raw) <= header_len else raw
    return len(raw).to_bytes(8, "little") + raw + data[8 + header_len:]


def _damaged(tmp_path, venv_python):
    """Damaged copies of one real file: each (label, path)."""
    good = tmp_path / "good.safetensors"
    _run(venv_python, WRITE, str(good), json.dumps(SPEC))
    data = good.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    cases = {
        "truncated to half": data[:len(data) // 2],
        "last byte missing": data[:-1],
        "header cut": data[:8 + header_len // 2],
        "length garbage": (10 ** 10).to_bytes(8, "little") + data[8:],
        "not json": data[:8] + b"#" * header_len + data[8 + header_len:],
        "empty": b"",
        "intact": data,
        "trailing bytes": data + b"\0" * 16,
        "a tensor range moved": _shift_first_range(data, header_len),
    }
    out = []
    for label, raw in cases.items():
        path = tmp_path / (label.replace(" ", "-") + ".safetensors")
        path.write_bytes(raw)
        out.append((label, path))
    return out


def test_refused_exactly_where_the_real_reader_fails(venv_python, tmp_path):
    cases = _damaged(tmp_path, venv_python)
    verdicts = json.loads(_run(venv_python, JUDGE, *[str(p) for _l, p in cases]))
    disagreements = []
    for label, path in cases:
        real_ok = verdicts[str(path)]["ok"]
        try:
            ck.tensors_of(str(path))
            ours_ok = True
        except ck.CheckpointError:
            ours_ok = False
        if ours_ok != real_ok:
            disagreements.append("%s: safetensors %s (%s), ours %s" % (
                label, "reads it" if real_ok else "fails", verdicts[str(path)].get("error", ""),
                "accepts it" if ours_ok else "refuses it"))
    assert not disagreements, disagreements
    # the cases are not all on one side
    assert {v["ok"] for v in verdicts.values()} == {True, False}


def test_a_sharded_checkpoint_written_by_safetensors_verifies(venv_python, tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text("{}")
    first, second = dict(list(SPEC.items())[:3]), dict(list(SPEC.items())[3:])
    _run(venv_python, WRITE, str(root / "model-00001-of-00002.safetensors"), json.dumps(first))
    _run(venv_python, WRITE, str(root / "model-00002-of-00002.safetensors"), json.dumps(second))
    weight_map = dict([(n, "model-00001-of-00002.safetensors") for n in first]
                      + [(n, "model-00002-of-00002.safetensors") for n in second])
    (root / ck.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    got = ck.verify(str(root))
    assert got["files"] == 2 and got["tensors"] == len(SPEC) and got["complete"]
    os.truncate(str(root / "model-00002-of-00002.safetensors"), 40)
    with pytest.raises(ck.CheckpointError) as err:
        ck.verify(str(root))
    assert err.value.path.endswith("model-00002-of-00002.safetensors")
