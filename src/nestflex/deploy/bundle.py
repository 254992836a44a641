"""The nestflex bundle: schema, integrity checks and :func:`load`.

A bundle is one directory (``model.nfx`` by convention) that describes itself:

* ``manifest.json``: schema and producer version, the input spec (shape, dtype, normalisation),
  the classes, the multi-capacity levels (profile rows + widths) and the program that runs them,
  the exit sets (``exits``: SPINN/SDN, ``flex_exits``: FlexDNN; same layout: heads, thresholds,
  confidence, fallback, calibration or plan), the split points (tensor
  shapes, float32 bytes, quantisation summary), the profiles it ships, the ONNX exports, and
  every file with its sha256 and size;
* ``weights.safetensors``: every tensor ONCE, the multi-capacity weights in nested order (level
  ``k`` reads a prefix), then the exit heads;
* ``onnx/*.onnx``: one graph per level, per backbone stage and per exit head (for other runtimes);
* ``profiles/*.json``: the split quantisation and layer precision profiles, exit calibration.

:func:`load` checks the schema and producer versions, the manifest's own digest, each file's size
and sha256, and that the manifest's tensor table matches the safetensors header, and reports
every problem in one :class:`BundleError`. Nothing is unpickled: the manifest is JSON, the
weights are safetensors. The writer is :func:`nestflex.export.export_bundle` (training side).
docs/deploy.md documents every key.

Example::

    import nestflex.deploy as nd
    bundle = nd.load("runs/vgg_cifar/bundle.nfx")
    [row["macs"] for row in bundle.levels]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

from nestflex import __version__
from nestflex.errors import NestflexError

__all__ = [
    "BundleError",
    "FORMAT",
    "SCHEMA_VERSION",
    "EXIT_SETS",
    "MANIFEST",
    "WEIGHTS",
    "Bundle",
    "load",
    "manifest_digest",
    "file_digest",
]

#: ``manifest["format"]`` of every bundle
FORMAT = "nestflex-bundle"
#: the manifest layout this runtime writes and reads; a larger number is refused. Additive keys
#: (``flex_exits``, ``kind``) do not bump it: a reader that predates them ignores them.
SCHEMA_VERSION = 1
#: manifest key -> ``kind`` of each exit set a bundle may hold; both have the same layout and run
#: under the same runtime and policy (``exits``: SPINN/SDN progressive exits, ``flex_exits``: FlexDNN)
EXIT_SETS = {"exits": "progressive", "flex_exits": "flexdnn"}
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"

_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64", "I32": "int32"}


class BundleError(NestflexError, ValueError):
    """A bundle is missing, corrupt, tampered with, of an unknown version, or used wrongly."""


def file_digest(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its ``integrity`` entry.

    Stored in ``manifest["integrity"]["manifest_sha256"]`` so an edited manifest is detected. It
    is a corruption check, not a signature: someone who edits the manifest on purpose can
    recompute it.
    """
    body = {k: v for k, v in manifest.items() if k != "integrity"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _version_tuple(text: Any) -> tuple[int, ...] | None:
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    return tuple(int(g or 0) for g in m.groups()) if m else None


def _read_manifest(root: Path) -> dict[str, Any]:
    if not root.exists():
        raise BundleError(
            f"bundle {str(root)!r} does not exist. HINT: write one with nestflex.export.export_bundle(...) or the "
            f"recipe's export stage (recipes/vgg_cifar.py --stages export)"
        )
    if not root.is_dir():
        raise BundleError(
            f"bundle {str(root)!r} is a file, not a bundle directory. HINT: pass the `.nfx` directory that holds "
            f"{MANIFEST}"
        )
    path = root / MANIFEST
    if not path.exists():
        raise BundleError(
            f"bundle {str(root)!r} has no {MANIFEST}, so it is not a nestflex bundle (or it was only partly copied). "
            f"HINT: copy the whole `.nfx` directory"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BundleError(f"bundle {str(root)!r}: {MANIFEST} is not valid JSON ({e}). HINT: the file is corrupt; "
                          f"export the bundle again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"bundle {str(root)!r}: {MANIFEST} has format {got!r}, expected {FORMAT!r}. "
                          f"HINT: this directory was not written by nestflex.export")
    return manifest


def _check_versions(root: Path, manifest: Mapping[str, Any]) -> None:
    schema = manifest.get("schema_version")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise BundleError(f"bundle {str(root)!r}: `schema_version` must be a positive int, got {schema!r}. "
                          f"HINT: the manifest is corrupt; export the bundle again")
    producer = manifest.get("producer") or {}
    if schema > SCHEMA_VERSION:
        raise BundleError(
            f"bundle {str(root)!r} has schema_version {schema}, written by nestflex {producer.get('version', '?')}; "
            f"this runtime (nestflex {__version__}) reads schema_version <= {SCHEMA_VERSION}. "
            f"HINT: upgrade nestflex on this device, or export with the nestflex version installed here"
        )
    ours, theirs = _version_tuple(__version__), _version_tuple(producer.get("version"))
    if producer.get("name") != "nestflex" or theirs is None:
        raise BundleError(f"bundle {str(root)!r}: unknown producer {producer!r}; expected nestflex with a version "
                          f"such as {__version__!r}. HINT: the manifest is corrupt; export the bundle again")
    if theirs[0] != ours[0]:
        # a new major version may change what a field means without changing the layout
        raise BundleError(
            f"bundle {str(root)!r} was written by nestflex {producer['version']}, a different major version than "
            f"this runtime (nestflex {__version__}). HINT: install nestflex {theirs[0]}.x here, or export again "
            f"with nestflex {__version__}"
        )


def _check_files(root: Path, manifest: Mapping[str, Any]) -> None:
    problems = []
    want = manifest.get("integrity", {}).get("manifest_sha256")
    if want != manifest_digest(manifest):
        problems.append(
            f"{MANIFEST} was modified after export (its digest does not match integrity.manifest_sha256)"
        )
    files = manifest.get("files")
    if not isinstance(files, dict) or WEIGHTS not in files:
        problems.append(f"{MANIFEST} lists no files (or not {WEIGHTS})")
        files = {}
    for rel, meta in files.items():
        path = root / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"file entry {rel!r} points outside the bundle")
            continue
        if not path.is_file():
            problems.append(f"file {rel!r} is missing")
            continue
        size = path.stat().st_size
        if size != meta.get("bytes"):
            problems.append(f"file {rel!r} has {size} bytes, the manifest says {meta.get('bytes')}")
            continue
        if file_digest(path) != meta.get("sha256"):
            problems.append(f"file {rel!r} fails its sha256 checksum (the content changed after export)")
    if problems:
        raise BundleError(
            f"bundle {str(root)!r} is corrupt or was tampered with: " + "; ".join(problems)
            + ". HINT: copy the bundle again from where it was exported, or export it again"
        )


def _check_weights(root: Path, manifest: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The safetensors header must hold exactly the manifest's tensors, shapes and dtypes."""
    path = root / WEIGHTS
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n <= 0 or n > path.stat().st_size - 8:
            raise BundleError(f"bundle {str(root)!r}: {WEIGHTS} is not a safetensors file. HINT: export again")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    declared = manifest.get("weights", {}).get("tensors", {})
    problems = []
    for name, meta in declared.items():
        got = header.get(name)
        if got is None:
            problems.append(f"tensor {name!r} is in the manifest but not in {WEIGHTS}")
        elif list(got["shape"]) != list(meta["shape"]) or _DTYPES.get(got["dtype"], got["dtype"]) != meta["dtype"]:
            problems.append(f"tensor {name!r} is {_DTYPES.get(got['dtype'], got['dtype'])}{got['shape']} in "
                            f"{WEIGHTS}, the manifest says {meta['dtype']}{meta['shape']}")
    extra = sorted(set(header) - set(declared))
    if extra:
        problems.append(f"{WEIGHTS} holds tensors the manifest does not list: {extra[:5]}")
    if problems:
        raise BundleError(f"bundle {str(root)!r}: the manifest does not match the weights: " + "; ".join(problems[:5])
                          + ". HINT: the manifest and weights come from different exports; export the bundle again")
    return declared


def _check_exit_sets(root: Path, manifest: Mapping[str, Any]) -> None:
    """Each exit set must be self-consistent: one tap, head and threshold per early exit."""
    problems = []
    for key in EXIT_SETS:
        ex = manifest.get(key)
        if ex is None:
            continue
        if not isinstance(ex, dict):
            problems.append(f"`{key}` is {type(ex).__name__}, expected an object or null")
            continue
        missing = [k for k in ("backbone", "names", "taps", "heads", "thresholds", "confidence", "fallback") if k not in ex]
        if missing:
            problems.append(f"`{key}` lacks {missing}")
            continue
        early = len(ex["names"]) - 1
        counts = {"taps": len(ex["taps"]), "heads": len(ex["heads"]), "thresholds": len(ex["thresholds"])}
        if any(n != early for n in counts.values()):
            problems.append(f"`{key}` has {early} early exits but {counts}")
        if ex["backbone"] not in ("shared", "own") or (ex["backbone"] == "own" and "program" not in ex):
            problems.append(f"`{key}.backbone` is {ex['backbone']!r}: expected 'shared', or 'own' with a `program`")
    if problems:
        raise BundleError(f"bundle {str(root)!r}: the exits in {MANIFEST} are inconsistent: " + "; ".join(problems)
                          + ". HINT: the manifest was written by hand or by a broken exporter; export the bundle again")


class Bundle:
    """A validated bundle on disk. Build runtimes from it; weights are read lazily, when paged in.

    Attributes:
        path: the bundle directory.
        manifest: the parsed ``manifest.json``.
        levels: one profile row per multi-capacity level (level, accuracy, params, macs,
            memory_mb, latency_ms, plus widths and weight_bytes), smallest first.
        num_levels: number of levels.
        exits: the ``exits`` section of the manifest (SPINN/SDN progressive exits), or ``None``.
        flex_exits: the ``flex_exits`` section (FlexDNN's planned fine-grained exits), or ``None``.
        exit_sets: the exit sets present, manifest key -> section (same layout for both kinds).
        splits: the split points of the largest level.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest

    @property
    def levels(self) -> list[dict[str, Any]]:
        return self.manifest["levels"]

    @property
    def num_levels(self) -> int:
        return len(self.manifest["levels"])

    @property
    def exits(self) -> dict[str, Any] | None:
        return self.manifest.get("exits")

    @property
    def flex_exits(self) -> dict[str, Any] | None:
        return self.manifest.get("flex_exits")

    @property
    def exit_sets(self) -> dict[str, dict[str, Any]]:
        return {k: self.manifest[k] for k in EXIT_SETS if self.manifest.get(k)}

    @property
    def splits(self) -> list[dict[str, Any]]:
        return self.manifest.get("splits", [])

    @property
    def input_spec(self) -> dict[str, Any]:
        return self.manifest["input"]

    @property
    def weights_path(self) -> Path:
        return self.path / WEIGHTS

    def file(self, rel: str) -> Path:
        """Absolute path of a file the manifest lists (e.g. ``profiles/split_quantization.json``)."""
        if rel not in self.manifest["files"]:
            raise BundleError(f"bundle {str(self.path)!r} has no file {rel!r}; files: {', '.join(self.manifest['files'])}")
        return self.path / rel

    def capacity(self, level: int | None = None):
        """A :class:`~nestflex.deploy.runtime.CapacityRuntime` with ``level`` resident (default: the largest)."""
        from nestflex.deploy.runtime import CapacityRuntime

        return CapacityRuntime(self, self.num_levels - 1 if level is None else level)

    def progressive(self, capacity=None, exit_set: str = "exits"):
        """A :class:`~nestflex.deploy.runtime.ProgressiveRuntime` (batched early exit).

        Args:
            capacity: when the exits share the multi-capacity backbone, the
                :class:`~nestflex.deploy.runtime.CapacityRuntime` to run on (a new one if ``None``);
                it is switched to the largest level.
            exit_set: which exits: ``"exits"`` (SPINN/SDN) or ``"flex_exits"`` (FlexDNN).

        Raises:
            BundleError: the bundle has no such exit set.
        """
        from nestflex.deploy.runtime import ProgressiveRuntime

        return ProgressiveRuntime(self, capacity, exit_set)

    def __repr__(self) -> str:
        sets = "".join(f", {k}={len(v['names'])}" for k, v in self.exit_sets.items() if k != "exits")
        ex = self.exits
        return (f"Bundle({str(self.path)!r}, levels={self.num_levels}, "
                f"exits={len(ex['names']) if ex else 0}{sets}, schema_version={self.manifest['schema_version']})")


def load(path: str | os.PathLike) -> Bundle:
    """Open and validate a bundle.

    Checks, in order: the directory and ``manifest.json`` exist and parse, the schema version is
    one this runtime reads, the producer is nestflex of the same major version, the manifest
    digest, every listed file's size and sha256, that the safetensors header matches the
    manifest's tensor table, and that each exit set has one tap, head and threshold per early
    exit. Nothing is unpickled.

    Args:
        path: the bundle directory (``*.nfx``).

    Returns:
        the :class:`Bundle`.

    Raises:
        BundleError: one message that names the bundle, every problem found, and a hint.
    """
    root = Path(path)
    manifest = _read_manifest(root)
    _check_versions(root, manifest)
    _check_files(root, manifest)
    _check_weights(root, manifest)
    _check_exit_sets(root, manifest)
    return Bundle(root, manifest)
