"""A corpus of corrupted bundles: each case is one damage to a copy of a good bundle, the same
every time for the same ``(kind, seed)``.

Used by the loader's property tests (tests/deploy/test_corruption.py), the CLI test and the fuzz
benchmark (benchmarks/deploy/fuzz.py). A kind is a function ``(root, rng) -> (description, consistent)``
that damages the bundle directory ``root`` in place; ``consistent`` says the damage rewrote the
checksums it broke (the manifest digest, a file's size and sha256), as someone who edits a bundle
on purpose would: such a bundle may load and then compute other outputs (the digest is not a
signature), while any other damage must be refused or leave the outputs bit-identical.

Kinds (``KINDS``):

* ``truncate``: a member file (any of them) cut at one of many offsets;
* ``flip_manifest``, ``flip_header_length``, ``flip_header``, ``flip_data``, ``flip_onnx``,
  ``flip_profile``: 1-8 bytes flipped in each region of the bundle;
* ``edit_field`` / ``edit_field_redigest``: one manifest value changed, digest kept / recomputed;
* ``wrong_type``: a value replaced by one of another JSON type (digest recomputed);
* ``bad_number``: a number replaced by a huge, negative, NaN, Infinity or 5,000-digit literal;
* ``structure``: a key deleted, a list emptied, reversed or doubled (digest recomputed);
* ``long_name``: 300-character (and 255-character) member names, a 5,000-character path;
* ``path_traversal``: ``../x``, absolute paths and friends in ``files`` and the file references;
* ``special_file``: a member replaced by a FIFO, a symlink out (``/dev/zero``, ``/dev/urandom``,
  ``/etc/passwd``, a copy outside), a dangling or looping symlink, a directory, a link inside;
* ``missing_member`` / ``extra_member``: a member (or a folder, or the manifest) deleted; a file
  added, listed or not;
* ``json_limits``: the manifest replaced by JSON at or past the parser's limits (depth, size,
  items, number length, encodings, the top-level type);
* ``safetensors_header``: the weights' header rewritten (length, JSON type, dtypes, shapes,
  offsets, metadata), the file's checksum and the manifest digest recomputed.

Example::

    from nestflex.testing.corruption import KINDS, corrupt, tiny_bundle
    good = tiny_bundle(Path("/tmp/c") / "good.nfx")
    case = corrupt(good, Path("/tmp/c/bad.nfx"), "truncate", seed=3)
    case.description   # "onnx/level_1.onnx truncated to 8 of 263549 bytes"
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nestflex.deploy.bundle.loader import MAX_MANIFEST_BYTES
from nestflex.deploy.bundle.constants import MANIFEST, WEIGHTS
from nestflex.deploy.bundle.manifest import manifest_digest
from nestflex.deploy.bundle.safetensors_header import MAX_HEADER_BYTES
from nestflex.deploy.bundle.strict_json import MAX_JSON_DEPTH, MAX_JSON_ITEMS
from nestflex.deploy.runtime.capacity import CapacityRuntime
from nestflex.deploy.runtime.progressive import ProgressiveRuntime

__all__ = ["KINDS", "Case", "corrupt", "outcome", "run_outputs", "tiny_bundle"]

Kind = Callable[[Path, random.Random], "tuple[str, bool]"]


@dataclass(frozen=True)
class Case:
    """One corrupted bundle: where it is, what was done, and whether the checksums were rewritten."""

    kind: str
    seed: int
    path: Path
    description: str
    consistent: bool


def tiny_bundle(dest: Path, onnx: bool = True, seed: int = 0) -> Path:
    """A small real bundle to damage: a 3-level nested VGG-11 x0.125 with two SDN exits on the
    largest level, an exit calibration profile and (``onnx``) its ONNX graphs; ~2.3 MB, 0.5 s."""
    import torch

    from nestflex.capacity.levels import LevelPlan
    from nestflex.capacity.nested import Source, extract_level, nest_
    from nestflex.exits import MultiExitNetwork
    from nestflex.export import export_bundle
    from nestflex.graph import trace
    from nestflex.models import create_model

    torch.manual_seed(seed)
    net = create_model("vgg11", width=0.125)
    groups = trace(net).prunable_groups
    K = 3
    plan = LevelPlan(tuple(range(K)), {g.name: list(range(g.width)) for g in groups},
                     tuple({g.name: max(1, g.width * (k + 1) // K) for g in groups} for k in range(K)), (0,) * K)
    nest_(net, plan, [Source({k: v.clone() for k, v in net.state_dict().items()})] * K)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # BatchNorm statistics that differ per level, so a wrong one shows in the outputs
        for name, b in net.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    exits = MultiExitNetwork(extract_level(net.eval(), K - 1), positions=(0.3, 0.6), head="sdn").eval()
    calibration = {"split": "validation", "samples": 100, "final_accuracy": 0.5,
                   "lossless": {"thresholds": [0.5, 0.6], "accuracy": 0.5, "mean_macs_fraction": 0.7},
                   "sweep": [{"thresholds": [0.3, 0.4], "accuracy": 0.45, "mean_macs_fraction": 0.5}]}
    export_bundle(dest, net, exits=exits, thresholds=[0.5, 0.6], onnx=onnx, calibration=calibration,
                  mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), classes=[f"c{i}" for i in range(10)])
    return dest


def corrupt(src: Path, dest: Path, kind: str, seed: int) -> Case:
    """Copy the bundle ``src`` to ``dest`` (which must not exist) and damage it: ``KINDS[kind]``
    with ``random.Random(f"{kind}:{seed}")``, so the same pair gives the same bytes."""
    shutil.copytree(src, dest, symlinks=True)
    description, consistent = KINDS[kind](Path(dest), random.Random(f"{kind}:{seed}"))
    return Case(kind, seed, Path(dest), description, consistent)


def run_outputs(bundle: Any) -> dict[str, Any]:
    """What a loaded bundle computes on a fixed input (seed 0, one sample of its declared shape):
    the capacity runtime's logits at every level, and each exit set's batched early exit."""
    import torch

    x = torch.randn(1, *bundle.input_spec["shape"], generator=torch.Generator().manual_seed(0))
    rt = CapacityRuntime(bundle, 0)
    out = {}
    for k in range(bundle.num_levels):
        rt.set_level(k)
        out[f"level_{k}"] = rt(x)
    for key in bundle.exit_sets:
        r = ProgressiveRuntime(bundle, rt, exit_set=key)(x)
        out[f"{key}_logits"], out[f"{key}_exit"] = r.logits, r.exit_index
    return out


def outcome(case: Case, reference: dict[str, Any]) -> str:
    """``"refused"`` (a BundleError), ``"identical"`` (loads, same outputs as ``reference``) or
    ``"runs"`` (loads and runs with other outputs: only allowed when ``case.consistent``).

    Raises:
        AssertionError: a bundle whose checksums were not rewritten loaded with other outputs,
            or one that loaded gave logits of the wrong shape; any exception of the loader other
            than BundleError, and any exception of the runtime on a loaded bundle, propagates.
    """
    import torch

    from nestflex.deploy import BundleError, load

    try:
        bundle = load(case.path)
    except BundleError:
        return "refused"
    outputs = run_outputs(bundle)
    if outputs.keys() == reference.keys() and all(torch.equal(outputs[k], reference[k]) for k in reference):
        return "identical"
    assert case.consistent, f"{case.kind}/{case.seed} ({case.description}): loaded with other outputs"
    n = bundle.spec.num_classes
    assert all(v.shape == (1, n) for k, v in outputs.items() if not k.endswith("_exit")), case
    return "runs"


# --------------------------------------------------------------------------------------------
# helpers


def _members(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / MANIFEST).read_text())


def _save(root: Path, m: dict[str, Any], redigest: bool) -> None:
    if redigest:
        try:
            digest = manifest_digest(m)
        except (ValueError, RecursionError):  # NaN, Infinity: what a careless editor would still write
            digest = "0" * 64
        if isinstance(m.get("integrity"), dict):
            m["integrity"]["manifest_sha256"] = digest
        else:
            m["integrity"] = {"manifest_sha256": digest}
    (root / MANIFEST).write_text(json.dumps(m, separators=(",", ":")))


def _relist(root: Path, m: dict[str, Any], rel: str) -> None:
    """Record ``rel``'s current size and sha256 in the manifest, as a deliberate editor would."""
    data = (root / rel).read_bytes()
    m.setdefault("files", {})[rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _paths(value: Any, containers: bool = False) -> list[tuple]:
    """Every path (tuple of keys) to a leaf of ``value`` (and to its containers, if asked), iteratively."""
    out, stack = [], [((), value)]
    while stack:
        path, v = stack.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else None
        if items is None:
            out.append(path)
            continue
        if containers and path:
            out.append(path)
        stack.extend((path + (k,), x) for k, x in items)
    return sorted(out, key=repr)  # dict order is the file's; sorted: independent of the walk


def _get(value: Any, path: tuple) -> Any:
    for k in path:
        value = value[k]
    return value


def _set(value: Any, path: tuple, new: Any) -> None:
    _get(value, path[:-1])[path[-1]] = new


def _flip_bytes(path: Path, lo: int, hi: int, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    hi = min(hi, len(data))
    if hi <= lo:
        return f"nothing to flip in bytes [{lo}, {hi}) of {path.name}"
    where = sorted(rng.randrange(lo, hi) for _ in range(rng.randint(1, 8)))
    for i in where:
        data[i] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))
    return f"bytes {where[:8]} flipped"


def _header_span(path: Path) -> tuple[int, int]:
    """``(8, 8 + n)``: where the weights' JSON header lies."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    return 8, 8 + n


# --------------------------------------------------------------------------------------------
# kinds


def truncate(root: Path, rng: random.Random) -> tuple[str, bool]:
    rel = rng.choice(_members(root))
    path = root / rel
    size = path.stat().st_size
    cuts = [0, 1, 7, 8, 9, size // 2, max(0, size - 1), rng.randrange(size + 1)]
    if rel == WEIGHTS:
        _, end = _header_span(path)
        cuts += [end - 1, end, end + 1]
    cut = min(rng.choice(cuts), size)
    with open(path, "r+b") as f:
        f.truncate(cut)
    return f"{rel} truncated to {cut} of {size} bytes", False


def _flipper(region: str) -> Kind:
    def flip(root: Path, rng: random.Random) -> tuple[str, bool]:
        weights = root / WEIGHTS
        if region == "manifest":
            path, lo, hi = root / MANIFEST, 0, (root / MANIFEST).stat().st_size
        elif region in ("header_length", "header", "data"):
            start, end = _header_span(weights)
            path = weights
            lo, hi = {"header_length": (0, 8), "header": (start, end), "data": (end, weights.stat().st_size)}[region]
        else:
            folder = {"onnx": "onnx/", "profile": "profiles/"}[region]
            files = [m for m in _members(root) if m.startswith(folder)] or [WEIGHTS]  # no onnx: the weights
            path = root / rng.choice(files)
            lo, hi = 0, path.stat().st_size
        return f"{path.relative_to(root)}: {_flip_bytes(path, lo, hi, rng)}", False

    flip.__name__ = f"flip_{region}"
    return flip


def _new_value(v: Any, rng: random.Random) -> Any:
    """A plausible edit of ``v`` that keeps its JSON type most of the time."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return rng.choice([v + 1, v - 1, -v, 0, v * 2**20, 2**31, -(2**31), 1])
    if isinstance(v, float):
        return rng.choice([v * 1.5, -v, 0.0, 1e300, v + 1.0, 1e-300])
    if isinstance(v, str):
        return rng.choice(["", v + "x", v[:-1], v.upper(), "../x", v * 3])
    return rng.choice([0, "x", [], {}])  # null


def _edit(redigest: bool) -> Kind:
    def edit(root: Path, rng: random.Random) -> tuple[str, bool]:
        m = _manifest(root)
        path = rng.choice(_paths(m))
        old = _get(m, path)
        new = _new_value(old, rng)
        _set(m, path, new)
        _save(root, m, redigest)
        return f"{_show(path)}: {old!r:.40} -> {new!r:.40}", redigest

    edit.__name__ = "edit_field_redigest" if redigest else "edit_field"
    return edit


_OTHER_TYPES = ["x", 3, 2.5, -1, None, True, [], {}, [1, 2], {"a": 1}, [[]], "", 0]


def wrong_type(root: Path, rng: random.Random) -> tuple[str, bool]:
    m = _manifest(root)
    path = rng.choice(_paths(m, containers=True))
    old = _get(m, path)
    new = rng.choice([t for t in _OTHER_TYPES if type(t) is not type(old)])
    _set(m, path, new)
    redigest = rng.random() < 0.8
    _save(root, m, redigest)
    return f"{_show(path)}: {type(old).__name__} -> {new!r}", redigest


_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1" + "0" * 300, "-" + "9" * 5000, str(2**63),
            str(-(2**63) - 1), str(2**64), "1e308", "-1", "-2147483649", "4294967296", "1e-320", "-0.0", "0.1",
            "123456789012345678901234567890", "2.5e-10"]


def bad_number(root: Path, rng: random.Random) -> tuple[str, bool]:
    m = _manifest(root)
    numeric = [p for p in _paths(m) if isinstance(_get(m, p), (int, float)) and not isinstance(_get(m, p), bool)]
    path = rng.choice(numeric)
    literal = rng.choice(_NUMBERS)
    sentinel = "__corruption_number__"
    _set(m, path, sentinel)
    try:  # what an editor computes the digest over: the value as Python reads it
        _set(m, path, json.loads(literal))
        _save(root, m, redigest=True)
        m = _manifest(root)
        _set(m, path, sentinel)
    except (ValueError, RecursionError):
        pass
    text = json.dumps(m, separators=(",", ":")).replace(json.dumps(sentinel), literal, 1)
    (root / MANIFEST).write_text(text)
    return f"{_show(path)} = {literal[:30]}{'...' if len(literal) > 30 else ''}", True


def structure(root: Path, rng: random.Random) -> tuple[str, bool]:
    m = _manifest(root)
    path = rng.choice(_paths(m, containers=True))
    parent, key = _get(m, path[:-1]), path[-1]
    value = parent[key]
    op = rng.choice(["delete", "empty", "reverse", "double"])
    if op == "delete":
        del parent[key]
    elif op == "empty":
        parent[key] = type(value)() if isinstance(value, (list, dict, str)) else None
    elif op == "reverse" and isinstance(value, list):
        value.reverse()
    elif isinstance(value, list):
        value.extend(copy.deepcopy(value))
    else:  # reverse/double of a non-list: the parent list reversed, or the key deleted
        del parent[key]
        op = "delete"
    _save(root, m, redigest=True)
    return f"{_show(path)}: {op}", True


def long_name(root: Path, rng: random.Random) -> tuple[str, bool]:
    m = _manifest(root)
    variant = rng.choice(["listed_300", "rename_300", "path_5000", "ok_255", "key_300_in_profiles"])
    if variant == "listed_300":  # a listed file whose name no file system accepts (ENAMETOOLONG)
        name = "p" * 300 + ".json"
        m["files"][name] = {"bytes": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}
    elif variant == "rename_300":
        rel = rng.choice(sorted(m["files"]))
        name = "w" * 300
        m["files"][name] = m["files"].pop(rel)
        if rel == WEIGHTS:
            m["weights"]["file"] = name
    elif variant == "path_5000":
        name = "a/" * 2500 + "x"
        m["files"][name] = {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    elif variant == "ok_255":  # the longest name a file system takes: a fine, listed file
        name = "n" * 250 + ".json"
        (root / name).write_text("{}")
        _relist(root, m, name)
    else:
        name = "q" * 300
        m.setdefault("profiles", {})["split_quantization"] = f"profiles/{name}.json"
    _save(root, m, redigest=True)
    return f"{variant}: {name[:20]}... ({len(name)} characters)", True


_ESCAPES = ["../x", "../../etc/passwd", "/etc/passwd", "a/../../x", "profiles/../../outside.json", "./../w", "..",
            ".", "", MANIFEST, "profiles\\..\\..\\x", "x\x00y", "onnx/../../outside.json", "//etc/passwd",
            "profiles/./../../outside.json", "C:/x"]


def path_traversal(root: Path, rng: random.Random) -> tuple[str, bool]:
    m = _manifest(root)
    target = rng.choice(_ESCAPES)
    outside = root.parent / "outside.json"  # exists, with the size and sha256 the entry gives
    outside.write_text("{}")
    entry = {"bytes": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}
    where = rng.choice(["files_add", "files_rename", "weights_file", "profile", "onnx", "calibration"])
    if where == "files_add":
        m["files"][target] = entry
    elif where == "files_rename":
        rel = rng.choice(sorted(m["files"]))
        m["files"][target] = m["files"].pop(rel)
    elif where == "weights_file":
        m["weights"]["file"] = target
    elif where == "profile":
        m.setdefault("profiles", {})["exit_calibration"] = target
    elif where == "onnx" and m.get("onnx"):
        m["onnx"][rng.randrange(len(m["onnx"]))]["file"] = target
    else:
        m["exit_sets"][0].setdefault("calibration", {})["file"] = target
    _save(root, m, redigest=True)
    return f"{where}: {target!r}", True


def special_file(root: Path, rng: random.Random) -> tuple[str, bool]:
    rel = rng.choice(_members(root))
    path = root / rel
    variant = rng.choice(["fifo", "dev_zero", "dev_urandom", "etc_passwd", "copy_outside", "dangling", "loop",
                          "directory", "link_inside_other", "link_inside_same", "socket"])
    saved = path.read_bytes()
    path.unlink()
    if variant == "fifo":
        os.mkfifo(path)
    elif variant in ("dev_zero", "dev_urandom", "etc_passwd"):
        path.symlink_to({"dev_zero": "/dev/zero", "dev_urandom": "/dev/urandom", "etc_passwd": "/etc/passwd"}[variant])
    elif variant == "copy_outside":  # the same bytes, so the same checksum: still not the bundle's file
        outside = root.parent / f"outside-{path.name}"
        outside.write_bytes(saved)
        path.symlink_to(outside)
    elif variant == "dangling":
        path.symlink_to(root / "no-such-file")
    elif variant == "loop":
        path.symlink_to(path)
    elif variant == "directory":
        path.mkdir()
        (path / "inner").write_bytes(saved[:64])
    elif variant == "link_inside_other":
        other = next(m for m in _members(root) if m != rel)
        path.symlink_to(os.path.relpath(root / other, path.parent))
    elif variant == "link_inside_same":  # a link to an identical file inside: loads, same outputs
        hidden = root / f".hidden-{path.name}"
        hidden.write_bytes(saved)
        path.symlink_to(os.path.relpath(hidden, path.parent))
    else:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.bind(str(path))
            s.close()
        except OSError:  # a socket path longer than 108 bytes: a FIFO instead
            variant = "fifo"
            os.mkfifo(path)
    return f"{rel} -> {variant}", False


def missing_member(root: Path, rng: random.Random) -> tuple[str, bool]:
    choices = _members(root) + [d for d in ("onnx", "profiles") if (root / d).is_dir()] + ["*"]
    rel = rng.choice(choices)
    if rel == "*":
        for p in list(root.iterdir()):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        return "every member deleted", False
    path = root / rel
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    return f"{rel} deleted", False


def extra_member(root: Path, rng: random.Random) -> tuple[str, bool]:
    variant = rng.choice(["unlisted", "unlisted_big", "unlisted_dir", "listed_absent", "listed_present",
                          "unlisted_fifo"])
    if variant == "unlisted":
        (root / "notes.txt").write_text("hello")
        return "an unlisted notes.txt", False
    if variant == "unlisted_big":
        with open(root / "big.bin", "wb") as f:  # sparse: 1 GiB of apparent size that load never reads
            f.truncate(2**30)
        return "an unlisted sparse 1 GiB file", False
    if variant == "unlisted_dir":
        (root / "extra" / "deeper").mkdir(parents=True)
        (root / "extra" / "deeper" / "x.json").write_text("[")
        return "an unlisted folder", False
    if variant == "unlisted_fifo":
        os.mkfifo(root / "pipe")
        return "an unlisted FIFO", False
    m = _manifest(root)
    if variant == "listed_absent":
        m["files"]["profiles/ghost.json"] = {"bytes": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}
    else:
        (root / "profiles").mkdir(exist_ok=True)
        (root / "profiles" / "added.json").write_text('{"added": true}')
        _relist(root, m, "profiles/added.json")
    _save(root, m, redigest=True)
    return f"files: {variant}", True


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def json_limits(root: Path, rng: random.Random) -> tuple[str, bool]:
    path = root / MANIFEST
    text = path.read_text()
    body = text.rstrip()[:-1]  # the manifest without its closing brace: more keys go here
    variant = rng.choice(["deep", "deep_at_limit", "deep_huge", "items", "big_string", "long_number",
                          "huge_number", "utf16", "bom", "bad_utf8", "surrogate", "duplicate_key", "top_list",
                          "top_string", "top_null", "empty", "whitespace_at_cap", "sparse_over_cap",
                          "unbalanced", "unterminated_string", "escaped_brackets"])
    depth_ok = MAX_JSON_DEPTH - 2  # the manifest object and the key's value are two levels
    data: bytes
    if variant == "deep":
        data = (body + f',"model":{_deep(MAX_JSON_DEPTH + 1)}}}').encode()
    elif variant == "deep_at_limit":
        data = (body + f',"model":{_deep(depth_ok)}}}').encode()
    elif variant == "deep_huge":
        data = ("[" * 1_000_000).encode()
    elif variant == "items":
        data = (body + ',"pad":[' + ",".join(["0"] * (MAX_JSON_ITEMS + 1)) + "]}").encode()
    elif variant == "big_string":  # valid JSON just under the size cap
        data = (body + ',"pad":"' + "x" * (MAX_MANIFEST_BYTES - len(body) - 16) + '"}').encode()
    elif variant == "long_number":
        data = (body + ',"pad":' + "7" * 1_000_000 + "}").encode()
    elif variant == "huge_number":
        data = (body + ',"pad":1e99999}').encode()
    elif variant == "utf16":
        data = text.encode("utf-16")
    elif variant == "bom":
        data = b"\xef\xbb\xbf" + text.encode()
    elif variant == "bad_utf8":
        data = (body + ',"pad":"').encode() + b"\xff\xfe" + b'"}'
    elif variant == "surrogate":
        data = (body + ',"pad":"\\ud800"}').encode()  # a lone surrogate escape: valid JSON, not valid text
    elif variant == "duplicate_key":
        data = (body + ',"format":"nestflex-bundle"}').encode()
    elif variant == "top_list":
        data = b"[" + text.encode() + b"]"
    elif variant == "top_string":
        data = json.dumps(text).encode()
    elif variant == "top_null":
        data = b"null"
    elif variant == "empty":
        data = b""
    elif variant == "whitespace_at_cap":
        data = text.encode() + b" " * (MAX_MANIFEST_BYTES - len(text.encode()))
    elif variant == "sparse_over_cap":
        with open(path, "r+b") as f:
            f.truncate(MAX_MANIFEST_BYTES + 1)
        return f"{MANIFEST}: {variant}", False
    elif variant == "unbalanced":
        data = (body + ',"pad":' + "]" * 100_000 + "}").encode()
    elif variant == "unterminated_string":
        data = (body + ',"pad":"\\').encode()
    else:  # brackets inside strings: fine, they are text
        data = (body + ',"pad":["' + "[" * 10_000 + '", "{\\"]"]}').encode()
    path.write_bytes(data)
    return f"{MANIFEST}: {variant} ({len(data):,} bytes)", False


def _rewrite_header(root: Path, header: Any, n: int | None = None, raw: bytes | None = None) -> None:
    """Replace the weights' JSON header (the tensor data stays), then relist the file and redigest."""
    path = root / WEIGHTS
    data = path.read_bytes()
    _, end = _header_span(path)
    text = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if n is None else n) + text + data[end:])
    m = _manifest(root)
    _relist(root, m, WEIGHTS)
    _save(root, m, redigest=True)


def safetensors_header(root: Path, rng: random.Random) -> tuple[str, bool]:
    path = root / WEIGHTS
    start, end = _header_span(path)
    header = json.loads(path.read_bytes()[start:end])
    names = sorted(k for k in header if k != "__metadata__")
    name = rng.choice(names)
    t = header[name]
    variant = rng.choice(["length_zero", "length_huge", "length_past_end", "length_over_cap", "length_short",
                          "top_list", "top_string", "deep", "nan", "entry_string", "dtype_unknown", "dtype_other",
                          "dtype_missing", "shape_huge", "shape_negative", "shape_float", "shape_many",
                          "offsets_reversed", "offsets_past_end", "offsets_overlap", "offsets_gap", "offsets_huge",
                          "offsets_missing", "metadata_number", "tensor_removed", "tensor_added", "renamed"])
    n: int | None = None
    raw: bytes | None = None
    if variant == "length_zero":
        n = 0
    elif variant == "length_huge":
        n = 2**64 - 1
    elif variant == "length_past_end":
        n = path.stat().st_size
    elif variant == "length_over_cap":
        n = MAX_HEADER_BYTES + 1
        with open(path, "r+b") as f:  # long enough that the length alone fits the file
            f.truncate(max(path.stat().st_size, MAX_HEADER_BYTES + 64))
    elif variant == "length_short":
        n = end - start - 1
    elif variant == "top_list":
        header = list(header.items())
    elif variant == "top_string":
        header = "x"
    elif variant == "deep":
        raw = (_deep(MAX_JSON_DEPTH + 10)).encode()
    elif variant == "nan":
        raw = json.dumps(header).replace(f'"{name}": {{"dtype"', f'"{name}": {{"nan": NaN, "dtype"', 1).encode()
    elif variant == "entry_string":
        header[name] = "F32"
    elif variant == "dtype_unknown":
        t["dtype"] = "F8"
    elif variant == "dtype_other":
        t["dtype"] = rng.choice(["I32", "F16", "U8", "F64", "BOOL"])
    elif variant == "dtype_missing":
        del t["dtype"]
    elif variant == "shape_huge":
        t["shape"] = [2**40] + t["shape"][1:]
    elif variant == "shape_negative":
        t["shape"] = [-1] + t["shape"][1:]
    elif variant == "shape_float":
        t["shape"] = [float(s) for s in t["shape"]]
    elif variant == "shape_many":
        t["shape"] = [2**62] * 100_000
    elif variant == "offsets_reversed":
        t["data_offsets"] = t["data_offsets"][::-1]
    elif variant == "offsets_past_end":
        t["data_offsets"] = [v + 2**20 for v in t["data_offsets"]]
    elif variant == "offsets_overlap":
        t["data_offsets"] = [max(0, t["data_offsets"][0] - 4), t["data_offsets"][1] - 4]
    elif variant == "offsets_gap":
        t["data_offsets"] = [t["data_offsets"][0] + 4, t["data_offsets"][1] + 4]
    elif variant == "offsets_huge":
        t["data_offsets"] = [0, 10**30]
    elif variant == "offsets_missing":
        del t["data_offsets"]
    elif variant == "metadata_number":
        header["__metadata__"] = {"format": 1}
    elif variant == "tensor_removed":
        del header[name]
    elif variant == "tensor_added":
        header["extra.tensor"] = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}
    else:
        header[name + ".renamed"] = header.pop(name)
    _rewrite_header(root, header, n, raw)
    return f"{WEIGHTS} header: {variant} ({name})", True


def _show(path: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)[:120]


KINDS: dict[str, Kind] = {
    "truncate": truncate,
    "flip_manifest": _flipper("manifest"),
    "flip_header_length": _flipper("header_length"),
    "flip_header": _flipper("header"),
    "flip_data": _flipper("data"),
    "flip_onnx": _flipper("onnx"),
    "flip_profile": _flipper("profile"),
    "edit_field": _edit(redigest=False),
    "edit_field_redigest": _edit(redigest=True),
    "wrong_type": wrong_type,
    "bad_number": bad_number,
    "structure": structure,
    "long_name": long_name,
    "path_traversal": path_traversal,
    "special_file": special_file,
    "missing_member": missing_member,
    "extra_member": extra_member,
    "json_limits": json_limits,
    "safetensors_header": safetensors_header,
}
