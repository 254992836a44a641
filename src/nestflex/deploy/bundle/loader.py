"""The nestflex bundle on disk: integrity checks, :func:`load` and :class:`Bundle`.

A bundle is one directory (``model.nfx`` by convention) that describes itself:

* ``manifest.json``: the :class:`~nestflex.deploy.bundle.manifest.Manifest` (one typed definition, in
  :mod:`nestflex.deploy.bundle.manifest`): schema and producer version, the input spec, the classes, the
  multi-capacity levels (profile rows + widths) and the program that runs them, the exit sets
  (``exit_sets``: a list of sets with a ``kind``, ``progressive`` for SPINN/SDN and ``flexdnn``
  for FlexDNN, same layout: heads, thresholds, confidence, fallback, calibration or plan), the
  split points (tensor shapes, float32 bytes, quantisation summary), the precision plan, the
  profiles it ships, the ONNX exports, and every file with its sha256 and size;
* ``weights.safetensors``: every tensor ONCE, the multi-capacity weights in nested order (level
  ``k`` reads a prefix), then the exit heads;
* ``onnx/*.onnx``: one graph per level, per backbone stage and per exit head (for other runtimes);
* ``profiles/*.json``: the split quantisation and layer precision profiles, exit calibration.

:func:`load` checks the schema and producer versions, the manifest's own digest, each file's size
and sha256, then reads the manifest through :meth:`Manifest.from_json
<nestflex.deploy.bundle.manifest.Manifest.from_json>` with the safetensors header (every field the runtime
uses: types, ranges, shapes, programs, regions, taps, FlexDNN filter indices), and reports every
problem in one :class:`BundleError`. Schema-1 bundles (``exits`` / ``flex_exits`` keys) are
upgraded on read. Nothing is unpickled: the manifest is JSON, the weights are safetensors. The
writer is :func:`nestflex.export.export_bundle` (training side), through the same schema.
docs/deploy.md documents every key.

Example::

    import nestflex.deploy as nd
    bundle = nd.load("runs/vgg_cifar/bundle.nfx")
    [row["macs"] for row in bundle.levels]
    bundle.spec.exit_set("flexdnn")          # the typed record, or None
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from nestflex import __version__
from nestflex.deploy.bundle.program import check_shapes
from nestflex.deploy.bundle._reading import describe, safe_relpath
from nestflex.deploy.bundle.constants import EXIT_SET_KEYS, FORMAT, MANIFEST, SCHEMA_VERSION, WEIGHTS
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.exit_records import ExitSet
from nestflex.deploy.bundle.manifest import Manifest, manifest_digest, parse_manifest
from nestflex.deploy.bundle.safetensors_header import read_safetensors_header
from nestflex.deploy.bundle.strict_json import parse_json

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

#: schema-1 manifest key -> ``kind`` of each exit set a bundle may hold; ``Bundle.exit_sets`` and
#: ``Bundle.progressive(exit_set=...)`` still name the sets by these keys (the kinds work too)
EXIT_SETS = {key: kind for kind, key in EXIT_SET_KEYS.items()}


def file_digest(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks.

    Args:
        path: the file to hash.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _version_tuple(text: Any) -> tuple[int, ...] | None:
    m = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?", text) if isinstance(text, str) else None
    return tuple(int(g or 0) for g in m.groups()) if m else None


#: the largest ``manifest.json`` :func:`load` reads (it is parsed whole, so peak memory is ~2x this
#: plus the objects; a VGG-16 x0.5 bundle's is ~90 KB); read at call time, so a program may raise it
MAX_MANIFEST_BYTES = 16 * 2**20


def member_problem(root: Path, rel: str) -> str | None:
    """Why ``root/rel`` is not a bundle member :func:`load` may read, or ``None``.

    Only regular files whose real path stays inside the bundle: a symlink out of it (to
    ``/etc/passwd``, ``/dev/urandom``), a FIFO (which blocks a reader forever) or a device is
    refused before anything opens it.
    """
    path = root / rel
    name = _name(rel)
    try:
        real, inside = os.path.realpath(path), os.path.realpath(root)
        if os.path.commonpath([real, inside]) != inside:
            return f"{name} is a link that leads out of the bundle (to {_name(real)})"
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as e:  # ENAMETOOLONG, ELOOP (a link to itself), ENOENT (a dangling link)
        return f"{name} cannot be read ({getattr(e, 'strerror', None) or e})"
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        return f"{name} is {kind}, not a regular file"
    return None


def _name(rel: str) -> str:
    """``repr(rel)``, shortened: a forged name may be thousands of characters long."""
    return repr(rel) if len(rel) <= 100 else f"{rel[:60]!r}...({len(rel):,} characters)"


def _exists(path: Path) -> bool:
    """Whether ``path`` (or a link at it) is there; ``True`` when the name cannot even be looked up
    (e.g. ENAMETOOLONG), so that :func:`member_problem` reports why."""
    try:
        return path.exists() or path.is_symlink()
    except OSError:
        return True


def _read_manifest(root: Path) -> dict[str, Any]:
    try:
        root.stat()
    except FileNotFoundError:
        pass
    except OSError as e:  # ENAMETOOLONG, ELOOP, EACCES: the path itself cannot be looked up
        raise BundleError(f"bundle {_name(str(root))} cannot be opened ({e.strerror or e}). HINT: check the "
                          f"path") from None
    if not root.exists():
        aside = sorted(root.parent.glob(f".{glob.escape(root.name)}.old-*"))
        if aside:  # an export was killed between moving the old bundle aside and the new one in
            raise BundleError(f"bundle {str(root)!r} does not exist: an export to it was interrupted. HINT: the "
                              f"previous bundle is whole at {str(aside[-1])!r}: rename it back, or export again")
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
    if not _exists(path):
        raise BundleError(
            f"bundle {str(root)!r} has no {MANIFEST}, so it is not a nestflex bundle (or it was only partly copied). "
            f"HINT: copy the whole `.nfx` directory"
        )
    problem = member_problem(root, MANIFEST)
    if problem is not None:
        raise BundleError(f"bundle {str(root)!r}: {problem}. HINT: copy the bundle as plain files")
    def too_big(size: Any) -> BundleError:
        return BundleError(f"bundle {str(root)!r}: {MANIFEST} has {size} bytes, above the {MAX_MANIFEST_BYTES}-byte "
                           f"limit (a VGG-16 bundle's is ~0.1 MB). HINT: the file is corrupt; export the bundle again "
                           f"(or raise nestflex.deploy.bundle.MAX_MANIFEST_BYTES for a model this large)")

    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise too_big(path.stat().st_size)
        with open(path, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)  # bounded even if the file grew since the stat
    except OSError as e:
        raise BundleError(f"bundle {str(root)!r}: {MANIFEST} cannot be read ({e.strerror or e}). HINT: check the "
                          f"file's permissions, or copy the bundle again") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise too_big(f"more than {MAX_MANIFEST_BYTES}")
    manifest = parse_json(data, f"bundle {str(root)!r}: {MANIFEST}", "the file is corrupt; export the bundle again")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise BundleError(f"bundle {str(root)!r}: {MANIFEST} has format {got!r:.80}, expected {FORMAT!r}. "
                          f"HINT: this directory was not written by nestflex.export")
    return manifest


def _check_versions(root: Path, manifest: Mapping[str, Any]) -> None:
    schema = manifest.get("schema_version")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise BundleError(f"bundle {str(root)!r}: `schema_version` must be a positive int, got {schema!r:.80}. "
                          f"HINT: the manifest is corrupt; export the bundle again")
    producer = manifest.get("producer")
    producer = producer if isinstance(producer, dict) else {}
    if schema > SCHEMA_VERSION:
        raise BundleError(
            f"bundle {str(root)!r} has schema_version {schema}, written by nestflex {producer.get('version', '?')!s:.40}; "
            f"this runtime (nestflex {__version__}) reads schema_version <= {SCHEMA_VERSION}. "
            f"HINT: upgrade nestflex on this device, or export with the nestflex version installed here"
        )
    ours, theirs = _version_tuple(__version__), _version_tuple(producer.get("version"))
    if producer.get("name") != "nestflex" or theirs is None:
        raise BundleError(f"bundle {str(root)!r}: unknown producer {manifest.get('producer')!r:.120}; expected "
                          f"nestflex with a version such as {__version__!r}. HINT: the manifest is corrupt; export "
                          f"the bundle again")
    if theirs[0] != ours[0]:
        # a new major version may change what a field means without changing the layout
        raise BundleError(
            f"bundle {str(root)!r} was written by nestflex {producer['version']}, a different major version than "
            f"this runtime (nestflex {__version__}). HINT: install nestflex {theirs[0]}.x here, or export again "
            f"with nestflex {__version__}"
        )


def _check_files(root: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Integrity problems: the manifest digest and every listed file's size and sha256.

    Entries of the wrong JSON type are skipped here: the schema reports them, with their path.
    """
    problems = []
    integrity = manifest.get("integrity")
    want = integrity.get("manifest_sha256") if isinstance(integrity, dict) else None
    try:
        digest = manifest_digest(manifest)
    except (ValueError, RecursionError):  # NaN/Infinity or over-deep values: never what the exporter wrote
        digest = None
    if want is None or want != digest:
        problems.append(f"{MANIFEST} was modified after export (its digest does not match "
                        f"integrity.manifest_sha256)")
    files = manifest.get("files")
    if not isinstance(files, dict) or WEIGHTS not in files:
        problems.append(f"{MANIFEST} lists no files (or not {WEIGHTS})")
        files = files if isinstance(files, dict) else {}
    for rel, meta in files.items():
        if not safe_relpath(rel):
            problems.append(f"file entry {_name(rel)} points outside the bundle")
            continue
        path = root / rel
        if not _exists(path):
            problems.append(f"file {_name(rel)} is missing")
            continue
        problem = member_problem(root, rel)
        if problem is not None:
            problems.append(problem)
            continue
        if not isinstance(meta, dict):
            continue
        try:
            size = path.stat().st_size
            if size != meta.get("bytes"):
                problems.append(f"file {_name(rel)} has {size} bytes, the manifest says {meta.get('bytes')!r:.40}")
                continue
            if file_digest(path) != meta.get("sha256"):
                problems.append(f"file {_name(rel)} fails its sha256 checksum (the content changed after export)")
        except OSError as e:
            problems.append(f"file {_name(rel)} cannot be read ({e.strerror or e})")
    return problems


def _check_index_values(root: Path, spec: Manifest) -> list[str]:
    """FlexDNN heads: the index tensors in the weights hold exactly the manifest's ``filters``.

    The schema has already checked the filters against the tapped layer's channels and the index
    tensors' shapes; this reads the few int64 values themselves (no torch needed).
    """
    heads = [(s, j, h) for s in spec.exit_sets for j, h in enumerate(s.heads) if h.filters is not None]
    if not heads:
        return []
    path = root / WEIGHTS
    problems = []
    try:
        header = read_safetensors_header(path)
        with open(path, "rb") as f:
            start = 8 + int.from_bytes(f.read(8), "little")
            for s, j, head in heads:
                name = head.index_tensor()
                meta = header.get(name) if name else None
                offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
                size = {"I64": 8, "I32": 4}.get(meta.get("dtype")) if isinstance(meta, dict) else None
                where = f"`{_set_path(spec, s)}.heads[{j}].filters`"
                if not (isinstance(offsets, list) and len(offsets) == 2 and size
                        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                        and 0 <= offsets[0] <= offsets[1]):
                    problems.append(f"{where} cannot be checked: the index tensor {name!r} has no readable data in "
                                    f"{WEIGHTS}")
                    continue
                f.seek(start + offsets[0])
                raw = f.read(offsets[1] - offsets[0])
                values = [int.from_bytes(raw[i : i + size], "little", signed=True) for i in range(0, len(raw), size)]
                if values != list(head.filters):
                    problems.append(f"{where} is {list(head.filters)[:8]}..., but the index tensor {name!r} in "
                                    f"{WEIGHTS} holds {values[:8]}... (other filters would feed the exit)")
    except (OSError, BundleError, ValueError) as e:
        problems.append(f"the FlexDNN filter indices in {WEIGHTS} cannot be read ({e})")
    return problems


def _set_path(spec: Manifest, s: ExitSet) -> str:
    return f"exit_sets[{spec.exit_sets.index(s)}]" if spec.schema_version >= 2 else s.key


def _message(root: Path, integrity: list[str], schema: list[str]) -> str:
    parts = []
    if integrity:
        parts.append("is corrupt or was tampered with: " + "; ".join(integrity)
                     + ". HINT: copy the bundle again from where it was exported, or export it again")
    if schema:
        parts.append(describe(schema))
    text = f"bundle {str(root)!r} " + parts[0] if integrity else f"bundle {str(root)!r}: " + parts[0]
    return text + "".join(f" Also, {p}" for p in parts[1:])


class Bundle:
    """A validated bundle on disk. Build runtimes from it; weights are read lazily, when paged in.

    Args:
        path: the bundle directory.
        spec: its :class:`~nestflex.deploy.bundle.manifest.Manifest` (or a manifest dict, validated here
            without the weights header; :func:`load` is the usual way in).

    Attributes:
        path: the bundle directory.
        spec: the typed :class:`~nestflex.deploy.bundle.manifest.Manifest`.
        manifest: ``spec.to_json()``: the manifest as a plain dict, in the current schema (a
            schema-1 bundle reads as its upgrade; ``spec.schema_version`` says what was on disk).
        levels: one profile row per multi-capacity level (level, accuracy, params, macs,
            memory_mb, latency_ms, plus widths and weight_bytes), smallest first.
        num_levels: number of levels.
        exits: the progressive (SPINN/SDN) exit set as a dict, or ``None``.
        flex_exits: FlexDNN's planned fine-grained exit set as a dict, or ``None``.
        exit_sets: the exit sets present, schema-1 key (``exits``/``flex_exits``) -> dict (same layout).
        splits: the split points of the largest level.
    """

    def __init__(self, path: str | os.PathLike, spec: Manifest | Mapping[str, Any]) -> None:
        self.path = Path(path)
        if not isinstance(spec, Manifest):
            spec = Manifest.from_json(spec, where=f"bundle {str(self.path)!r}")
        self._spec = spec
        self._manifest: dict[str, Any] | None = None

    @property
    def spec(self) -> Manifest:
        return self._spec

    @property
    def manifest(self) -> dict[str, Any]:
        if self._manifest is None:
            self._manifest = self._spec.to_json()
        return self._manifest

    @property
    def levels(self) -> list[dict[str, Any]]:
        return self.manifest["levels"]

    @property
    def num_levels(self) -> int:
        return self._spec.num_levels

    @property
    def exits(self) -> dict[str, Any] | None:
        return self.exit_sets.get("exits")

    @property
    def flex_exits(self) -> dict[str, Any] | None:
        return self.exit_sets.get("flex_exits")

    @property
    def exit_sets(self) -> dict[str, dict[str, Any]]:
        return {EXIT_SET_KEYS[s["kind"]]: s for s in self.manifest["exit_sets"]}

    @property
    def splits(self) -> list[dict[str, Any]]:
        return self.manifest["splits"]

    @property
    def input_spec(self) -> dict[str, Any]:
        return self.manifest["input"]

    @property
    def weights_path(self) -> Path:
        return self.path / WEIGHTS

    def file(self, rel: str) -> Path:
        """Absolute path of a file the manifest lists (e.g. ``profiles/split_quantization.json``)."""
        if rel not in self._spec.files:
            raise BundleError(f"bundle {str(self.path)!r} has no file {rel!r}; files: {', '.join(self._spec.files)}")
        return self.path / rel

    def samples(self) -> tuple[Any, Any] | None:
        """The labelled inputs the bundle ships for tuning, ``(inputs, labels)``, or ``None`` without them.

        Inputs are float32 ``(count, *input.shape)``, labels int64 class indices ``(count,)``; the
        file's sha256 was checked by :func:`load`, its tensors are checked here.

        Raises:
            BundleError: the file holds other tensors, shapes or labels than the manifest promises.
        """
        s = self._spec.samples
        if s is None:
            return None
        from safetensors.numpy import load_file

        path = self.file(s.file)
        where = f"bundle {str(self.path)!r}: {s.file}"
        try:
            t = load_file(str(path))
        except Exception as e:  # safetensors raises its own types for a damaged header
            raise BundleError(f"{where} cannot be read ({type(e).__name__}: {e}). HINT: re-export the bundle") from None
        x, y = t.get("inputs"), t.get("labels")
        shape = (s.count, *self._spec.input.shape)
        if x is None or x.dtype != np.float32 or tuple(x.shape) != shape:
            raise BundleError(f"{where}: `inputs` must be float32 {list(shape)} (samples.count x input.shape), got "
                              f"{'nothing' if x is None else f'{x.dtype} {list(x.shape)}'}. HINT: re-export the bundle")
        if y is None or y.dtype != np.int64 or tuple(y.shape) != (s.count,):
            raise BundleError(f"{where}: `labels` must be int64 [{s.count}], got "
                              f"{'nothing' if y is None else f'{y.dtype} {list(y.shape)}'}. HINT: re-export the bundle")
        if s.count and (int(y.min()) < 0 or int(y.max()) >= self._spec.num_classes):
            raise BundleError(f"{where}: `labels` must be class indices in [0, {self._spec.num_classes - 1}], got "
                              f"[{int(y.min())}, {int(y.max())}]. HINT: re-export the bundle")
        return x, y

    def __repr__(self) -> str:
        sets = "".join(f", {s.key}={len(s.names)}" for s in self._spec.exit_sets if s.kind != "progressive")
        ex = self._spec.exit_set("progressive")
        return (f"Bundle({str(self.path)!r}, levels={self.num_levels}, exits={len(ex.names) if ex else 0}{sets}, "
                f"schema_version={self._spec.schema_version})")


def bundle_id(bundle: Any) -> str:
    """The identity both ends of a split compare: the manifest's sha256 (it covers every file's digest).

    Args:
        bundle: a loaded :class:`Bundle` (anything with its ``manifest`` dict).

    Returns:
        The hex digest, or ``""`` when the manifest records none.
    """
    return str((bundle.manifest.get("integrity") or {}).get("manifest_sha256", ""))


def load(path: str | os.PathLike) -> Bundle:
    """Open and validate a bundle.

    Checks, in order: the directory and ``manifest.json`` exist, are regular files inside the
    bundle, within :data:`MAX_MANIFEST_BYTES`, and parse as strict JSON
    (:func:`~nestflex.deploy.bundle.strict_json.parse_json`: bounded depth, items and number length, no
    NaN/Infinity), the schema version is one this runtime reads, the producer is nestflex of the same major version (these stop at the
    first problem); then the manifest digest, every listed file's size and sha256, and the whole
    manifest through :meth:`Manifest.from_json <nestflex.deploy.bundle.manifest.Manifest.from_json>` with
    the safetensors header (types, finite numbers, ranges, tensor shapes and dtypes, programs,
    regions, exit taps, split nodes, FlexDNN filter indices, also against the index tensors'
    values). Every problem of the second group is reported together. Schema-1 bundles are
    upgraded on read. Nothing is unpickled.

    Args:
        path: the bundle directory (``*.nfx``).

    Returns:
        the :class:`Bundle`.

    Raises:
        BundleError: one message that names the bundle, every problem found, and a hint;
            ``BundleError.problems`` lists the problems one by one.
    """
    root = Path(path)
    raw = _read_manifest(root)
    _check_versions(root, raw)
    integrity = _check_files(root, raw)
    header = None
    weights = root / WEIGHTS
    if weights.is_file() and member_problem(root, WEIGHTS) is None:
        try:
            header = read_safetensors_header(weights)
        except BundleError as e:
            integrity.append(f"{WEIGHTS} is not a safetensors file ({e.problems[0] if e.problems else e})")
    spec, schema = parse_manifest(raw, header)
    if spec is not None and not integrity:
        schema += _check_index_values(root, spec)
    if spec is not None and not integrity and not schema:
        schema += check_shapes(spec)
    if integrity or schema:
        raise BundleError(_message(root, integrity, schema), [*integrity, *schema])
    return Bundle(root, spec)
