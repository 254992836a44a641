"""The bundle manifest, defined once: typed, frozen records that the writer and the reader share.

The exporter (:func:`nestflex.export.export_bundle`, training side) builds a :class:`Manifest`
and writes :meth:`Manifest.to_json` to ``manifest.json``; :func:`nestflex.deploy.load` reads it
back with :meth:`Manifest.from_json`, and the exporter checks what it wrote with the same call, so
writer and reader cannot drift. ``from_json`` validates every field the runtime uses (JSON types,
finite numbers, ranges, tensor shapes and dtypes against the safetensors header, program node ops,
arguments and attributes, regions inside their tensors, exit taps, FlexDNN filter indices, split
nodes) and reports *every* problem it finds in one :class:`BundleError`, each named by its path
(``levels[2].memory_mb``) with the value it found. It raises nothing else, whatever the JSON holds.

Records (one per manifest section): :class:`Manifest` and :class:`Producer` here, the others in
the modules beside this one: :class:`InputSpec` (:mod:`.input_records`); :class:`LevelRow` and
:class:`Capacity` (:mod:`.capacity_records`); :class:`Program` of :class:`ProgramNode`
(:mod:`.program_records`); :class:`ExitSet` with :class:`ExitHead`, :class:`ExitPlan` and
:class:`OperatingPoint` (:mod:`.exit_records`); :class:`SplitPoint` (:mod:`.split_records`) with
:class:`SplitQuantization` of :class:`QuantizationRow`, and :class:`PrecisionPlan`
(:mod:`.quantization_records`); :class:`Weights` of :class:`TensorInfo`, :class:`OnnxFile`,
:class:`SampleSet` and :class:`FileEntry` (:mod:`.file_records`). Keys a record does not know
are kept in its ``extra`` and written back (additive keys from a newer exporter survive a read);
everything the runtime reads is typed. The format's names (``FORMAT``, ``SCHEMA_VERSION``, the
file names, ``EXIT_SET_KEYS``) are in :mod:`.constants`, the error in :mod:`.errors`.

Schema versions: **2** lists the exit sets as ``"exit_sets": [{"kind": "progressive", ...},
{"kind": "flexdnn", ...}]``. **1** had two parallel keys, ``exits`` and ``flex_exits``; a
version-1 manifest is upgraded on read (problems are reported under its own key names), and
:meth:`Manifest.to_json` always writes the current version.

Why a hand-written reader (the ``r.`` getters of :mod:`._reading`) and not a validation library:
pydantic v2 was considered (it too collects every error with its path and can keep unknown keys),
but importing it with one model class costs 220-330 ms and +16 MB RSS on the 2-core machine the
runtime was measured on (numpy alone takes ~200-250 ms and 25 MB), against the light runtime's goals
of import + load <= 0.5 s and <= 100 MB; so the reader stays hand-written.

Examples:
    >>> m = Manifest.from_json(json.load(open("model.nfx/manifest.json")))  # doctest: +SKIP
    >>> [s.kind for s in m.exit_sets], m.num_levels                         # doctest: +SKIP
    (['progressive', 'flexdnn'], 3)
    >>> Manifest.from_json(m.to_json()) == m                                # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from nestflex.deploy.bundle._cross_checks import _cross_check
from nestflex.deploy.bundle._reading import (
    _BAD,
    _MAX_DEPTH,
    _extra,
    _failed,
    _join,
    _list,
    _Reader,
    _Record,
    _show,
    _walk_free_form,
    describe,
    safe_relpath,
)
from nestflex.deploy.bundle.capacity_records import Capacity, LevelRow
from nestflex.deploy.bundle.constants import EXIT_SET_KEYS, FORMAT, SCHEMA_VERSION, WEIGHTS
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.exit_records import ExitSet
from nestflex.deploy.bundle.file_records import FileEntry, OnnxFile, SampleSet, Weights
from nestflex.deploy.bundle.input_records import InputSpec
from nestflex.deploy.bundle.quantization_records import PrecisionPlan
from nestflex.deploy.bundle.split_records import SplitPoint

__all__ = [
    "Manifest",
    "Producer",
    "parse_manifest",
    "manifest_digest",
]


@dataclass(frozen=True)
class Producer(_Record):
    """Who wrote the bundle: ``name`` (``nestflex``), ``version``, ``torch``."""

    name: str
    version: str
    torch: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _PATH: ClassVar[str] = "producer"

    @classmethod
    def _read(cls, r: _Reader, v: Any, path: str) -> Producer | None:
        before = r.count
        v = r.obj(v, path)
        name = r.str_(r.get(v, "name", path), _join(path, "name"))
        version = r.str_(r.get(v, "version", path), _join(path, "version"))
        torch = r.str_(r.get(v, "torch", path, required=False), _join(path, "torch"), null=True)
        if _failed(r, before):
            return None
        return cls(name, version, torch, _extra(v, ("name", "version", "torch")))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "torch": self.torch, **self.extra}


@dataclass(frozen=True)
class Manifest(_Record):
    """The whole ``manifest.json`` (docs/deploy.md lists every key).

    Build one to write a bundle (the exporter does), or read one with :meth:`from_json`, which
    validates it; :meth:`to_json` gives the plain dict written to ``manifest.json`` (always the
    current :data:`SCHEMA_VERSION`).

    Attributes:
        producer: who wrote the bundle (:class:`Producer`).
        input: what the model takes (:class:`InputSpec`).
        num_classes: logits per sample.
        classes: class names, index = label, or ``None``.
        levels: one :class:`LevelRow` per level, smallest first.
        capacity: the multi-capacity backbone (:class:`Capacity`).
        weights: the tensor table (:class:`Weights`).
        exit_sets: the exit sets (:class:`ExitSet`, at most one per kind).
        splits: the split points (:class:`SplitPoint`) of the largest level.
        precision: the precision plan, or ``None``.
        samples: the labelled sample inputs (:class:`SampleSet`), or ``None``.
        profiles: profile name -> shipped file.
        onnx: the ONNX files (:class:`OnnxFile`).
        files: path -> :class:`FileEntry`, every file but the manifest.
        model: the producer's provenance (free-form JSON object), or ``None``.
        switching: measured level switches (objects with ``from``, ``to``, ``nested_ms``), or ``None``.
        created_unix: export time, in seconds since the Unix epoch.
        integrity: ``{"manifest_sha256": ...}`` (:func:`manifest_digest`), or ``None`` before it is computed.
        extra: top-level keys this version does not know (kept, written back).
        schema_version: the version the manifest was *read* in (1 for an upgraded bundle; not compared).
    """

    producer: Producer
    input: InputSpec
    num_classes: int
    levels: tuple[LevelRow, ...]
    capacity: Capacity
    weights: Weights
    classes: tuple[str, ...] | None = None
    exit_sets: tuple[ExitSet, ...] = ()
    splits: tuple[SplitPoint, ...] = ()
    precision: PrecisionPlan | None = None
    profiles: dict[str, str] = field(default_factory=dict)
    samples: SampleSet | None = None
    onnx: tuple[OnnxFile, ...] = ()
    files: dict[str, FileEntry] = field(default_factory=dict)
    model: dict[str, Any] | None = None
    switching: tuple[dict[str, Any], ...] | None = None
    created_unix: int = 0
    integrity: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    schema_version: int = field(default=SCHEMA_VERSION, compare=False)

    _KEYS: ClassVar[tuple[str, ...]] = ("format", "schema_version", "producer", "created_unix", "input", "num_classes",
                                        "classes", "levels", "model", "switching", "capacity", "exit_sets", "splits",
                                        "profiles", "precision", "samples", "weights", "onnx", "files",
                                        "integrity")

    @property
    def num_levels(self) -> int:
        return self.capacity.num_levels

    def exit_set(self, name: str) -> ExitSet | None:
        """The exit set of kind ``name`` (``progressive``/``flexdnn``) or schema-1 key (``exits``/``flex_exits``)."""
        return next((s for s in self.exit_sets if name in (s.kind, s.key)), None)

    @classmethod
    def from_json(cls, obj: Any, *, weights_header: Mapping[str, Any] | None = None,
                  where: str = "manifest") -> Manifest:
        """Validate a parsed ``manifest.json`` (schema 1 or 2) and return its record.

        Args:
            obj: the parsed JSON.
            weights_header: the safetensors header of the weights (:func:`read_safetensors_header`);
                when given, the tensor table must match it exactly (names, shapes, dtypes).
            where: what the message names (``"bundle 'model.nfx'"``).

        Returns:
            the :class:`Manifest`.

        Raises:
            BundleError: every problem found, each named by its path, with the value and what was
                expected; ``BundleError.problems`` lists them one by one.
        """
        spec, problems = parse_manifest(obj, weights_header)
        if problems:
            raise BundleError(f"{where}: {describe(problems)}", problems)
        return spec

    def to_json(self) -> dict[str, Any]:
        """The plain dict written to ``manifest.json`` (JSON types only, schema :data:`SCHEMA_VERSION`)."""
        return {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "producer": self.producer.to_json(),
            "created_unix": self.created_unix,
            "input": self.input.to_json(),
            "num_classes": self.num_classes,
            "classes": _list(self.classes),
            "levels": [row.to_json() for row in self.levels],
            "model": self.model,
            "switching": None if self.switching is None else [dict(s) for s in self.switching],
            "capacity": self.capacity.to_json(),
            "exit_sets": [s.to_json() for s in self.exit_sets],
            "splits": [s.to_json() for s in self.splits],
            "profiles": dict(self.profiles),
            "precision": None if self.precision is None else self.precision.to_json(),
            **({} if self.samples is None else {"samples": self.samples.to_json()}),
            "weights": self.weights.to_json(),
            "onnx": [o.to_json() for o in self.onnx],
            "files": {rel: f.to_json() for rel, f in self.files.items()},
            "integrity": None if self.integrity is None else dict(self.integrity),
            **self.extra,
        }


# --------------------------------------------------------------------------------------------
# reading a whole manifest: structure first, then the checks that span sections


def parse_manifest(obj: Any, weights_header: Mapping[str, Any] | None = None) -> tuple[Manifest | None, list[str]]:
    """The :class:`Manifest` and ``[]``, or ``None`` and every problem (what :meth:`Manifest.from_json` raises)."""
    r = _Reader()
    try:
        spec = _read_manifest(r, obj, weights_header)
    except RecursionError:  # pragma: no cover - inputs are depth-checked first; belt and braces
        r.fail("manifest", f"is nested too deeply to read (deeper than {_MAX_DEPTH} levels)")
        spec = None
    except Exception as e:  # pragma: no cover - a validator bug must still surface as a BundleError
        r.fail("manifest", f"could not be validated ({type(e).__name__}: {e}); this is a nestflex bug, please "
                           f"report it with the manifest")
        spec = None
    return (None, r.problems) if r.count else (spec, [])


def _read_manifest(r: _Reader, obj: Any, header: Mapping[str, Any] | None) -> Manifest | None:
    if not isinstance(obj, Mapping):
        r.fail("manifest", f"must be a JSON object, got {_show(obj)}")
        return None
    _walk_free_form(r, obj, "")
    obj = r.obj(obj, "manifest")
    if obj is _BAD:
        return None
    r.str_(obj.get("format"), "format", choices=(FORMAT,))
    version = r.int_(r.get(obj, "schema_version", ""), "schema_version", lo=1, hi=SCHEMA_VERSION)
    if version is _BAD:  # read the layout the keys suggest, to report what else is wrong
        version = 1 if ("exits" in obj or "flex_exits" in obj) else SCHEMA_VERSION
    g = lambda k, required=True: r.get(obj, k, "", required)
    producer = Producer._read(r, g("producer"), "producer")
    created = r.int_(g("created_unix"), "created_unix", lo=0)
    spec_input = InputSpec._read(r, g("input"), "input")
    num_classes = r.int_(g("num_classes"), "num_classes", lo=1)
    classes = r.strs(g("classes", False), "classes", null=True)
    if isinstance(num_classes, int):
        r.length(classes, "classes", num_classes, "one name per class, `num_classes`")
    raw_levels = r.seq(g("levels"), "levels")
    levels = [] if raw_levels is _BAD else [LevelRow._read(r, row, _join("levels", i), i)
                                             for i, row in enumerate(raw_levels)]
    if raw_levels is not _BAD and not raw_levels:
        r.fail("levels", "is empty; a bundle has at least one level")
    model = r.obj(g("model", False), "model", null=True)
    switching = _read_switching(r, g("switching", False))
    capacity = Capacity._read(r, g("capacity"), "capacity")

    # the exit sets, each with the path its problems are reported under
    sources: list[tuple[str, Any, str | None]] = []
    if version == 1:
        for kind, key in EXIT_SET_KEYS.items():
            if obj.get(key) is not None:
                sources.append((key, obj[key], kind))
        if "exit_sets" in obj:
            r.fail("exit_sets", "is a schema-2 key in a schema-1 manifest (schema 1 has `exits` and `flex_exits`)")
    else:
        for key in EXIT_SET_KEYS.values():
            if key in obj:
                r.fail(key, f"is a schema-1 key; schema {version} lists exit sets in `exit_sets` (with their `kind`)")
        raw_sets = r.seq(g("exit_sets", False), "exit_sets", null=True) or []
        if raw_sets is not _BAD:
            sources = [(_join("exit_sets", i), s, None) for i, s in enumerate(raw_sets)]
    exit_sets = [(p, ExitSet._read(r, s, p, kind)) for p, s, kind in sources]

    raw_splits = r.seq(g("splits", False), "splits", null=True) or []
    splits = [] if raw_splits is _BAD else [SplitPoint._read(r, s, _join("splits", i)) for i, s in enumerate(raw_splits)]
    profiles = r.obj(g("profiles", False), "profiles", null=True) or {}
    if profiles is not _BAD:
        profiles = {k: r.file(f, _join("profiles", k)) for k, f in profiles.items()}
    precision = g("precision", False)
    if precision is not None:
        precision = PrecisionPlan._read(r, precision, "precision")
    samples = g("samples", False)
    if samples is not None:
        samples = SampleSet._read(r, samples, "samples")
    weights = Weights._read(r, g("weights"), "weights")
    raw_onnx = r.seq(g("onnx", False), "onnx", null=True) or []
    onnx = [] if raw_onnx is _BAD else [OnnxFile._read(r, o, _join("onnx", i), version) for i, o in enumerate(raw_onnx)]
    raw_files = r.obj(g("files"), "files")
    files = {}
    if raw_files is not _BAD:
        for rel, meta in raw_files.items():
            if not safe_relpath(rel):
                r.fail(_join("files", rel), "is not a plain relative path inside the bundle (absolute, '..', a "
                                           "backslash or a control character); refused")
            files[rel] = FileEntry._read(r, meta, _join("files", rel))
        if WEIGHTS not in raw_files:
            r.fail("files", f"does not list {WEIGHTS}")
    integrity = r.obj(g("integrity", False), "integrity", null=True)
    if isinstance(integrity, dict):
        r.str_(r.get(integrity, "manifest_sha256", "integrity"), "integrity.manifest_sha256")

    known = set(Manifest._KEYS) | (set(EXIT_SET_KEYS.values()) if version == 1 else set())
    extra = {k: v for k, v in obj.items() if k not in known}
    # checks across sections; each runs on the sections that read cleanly, so one broken section
    # does not hide the problems of the others
    _cross_check(r, capacity, levels, [s for _, s in exit_sets], [p for p, _ in exit_sets], splits, weights, header,
                 spec_input, files, profiles, precision, onnx, switching, samples)
    if r.count:
        return None
    return Manifest(producer, spec_input, num_classes, tuple(levels), capacity, weights, classes,
                    tuple(s for _, s in exit_sets), tuple(splits), precision, profiles, samples, tuple(onnx), files,
                    model, switching, created, integrity, extra, schema_version=version)


def _read_switching(r: _Reader, v: Any) -> Any:
    v = r.seq(v, "switching", null=True)
    if v is None or v is _BAD:
        return v
    rows = []
    for i, row in enumerate(v):
        p = _join("switching", i)
        row = r.obj(row, p)
        if row is _BAD:
            continue
        r.int_(r.get(row, "from", p), _join(p, "from"), lo=0)
        r.int_(r.get(row, "to", p), _join(p, "to"), lo=0)
        r.num(r.get(row, "nested_ms", p, required=False), _join(p, "nested_ms"), lo=0, null=True)
        rows.append(row)
    return tuple(rows)


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its ``integrity`` entry.

    Stored in ``manifest["integrity"]["manifest_sha256"]`` so an edited manifest is detected. It
    is a corruption check, not a signature: someone who edits the manifest on purpose can
    recompute it.

    Raises:
        ValueError: the manifest holds NaN or Infinity (JSON has neither); RecursionError: nested too deep.
    """
    body = {k: v for k, v in manifest.items() if k != "integrity"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
