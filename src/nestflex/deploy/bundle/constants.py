"""The bundle format's names: its ``format`` string and schema version, its file names, the kinds of
exit set and backbone, and the tensor dtypes a manifest may name.
"""

from __future__ import annotations

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "MANIFEST",
    "WEIGHTS",
    "SAMPLES",
    "EXIT_KINDS",
    "EXIT_SET_KEYS",
    "BACKBONES",
    "DTYPES",
    "FLOAT_DTYPES",
    "INDEX_DTYPES",
]

#: ``manifest["format"]`` of every bundle
FORMAT = "nestflex-bundle"
#: the manifest layout written here; :meth:`Manifest.from_json` reads 1 and 2 and refuses larger
SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
SAMPLES = "samples.safetensors"  # the optional labelled samples (SampleSet)
#: the kinds of exit set a bundle may hold (at most one of each); both run under the same runtime
EXIT_KINDS: tuple[str, ...] = ("progressive", "flexdnn")
#: kind -> the key that held the set in schema 1 (and that ``Bundle.exit_sets`` still uses)
EXIT_SET_KEYS: dict[str, str] = {"progressive": "exits", "flexdnn": "flex_exits"}
#: ``shared``: the heads sit on the capacity backbone's largest level; ``own``: the set stores its backbone
BACKBONES: tuple[str, ...] = ("shared", "own")
#: tensor dtype (manifest spelling) -> bytes per element
DTYPES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
                          "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
#: the floating-point dtypes (an input, and every tensor a computing op reads)
FLOAT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
#: the dtypes of an ``index_select`` index tensor
INDEX_DTYPES: tuple[str, ...] = ("int64", "int32")
