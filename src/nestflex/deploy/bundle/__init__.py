"""The bundle format: the manifest and its records (:mod:`.manifest`, one ``*_records`` module per
group of sections, the format's names in :mod:`.constants`, :class:`BundleError` in :mod:`.errors`),
strict JSON (:mod:`.strict_json`) and the safetensors header (:mod:`.safetensors_header`), the loader
(:mod:`.loader`), and the program it describes checked as a network (:mod:`.program`). The bottom
layer of the runtime: it imports no other part of :mod:`nestflex.deploy` but the registry helper, and
every other part reads bundles through it.
"""

from nestflex.deploy.bundle.loader import EXIT_SETS, MAX_MANIFEST_BYTES, Bundle, bundle_id, file_digest, load
from nestflex.deploy.bundle.constants import SCHEMA_VERSION
from nestflex.deploy.bundle.errors import BundleError
from nestflex.deploy.bundle.manifest import Manifest

__all__ = ["SCHEMA_VERSION", "EXIT_SETS", "MAX_MANIFEST_BYTES", "Bundle", "BundleError", "Manifest", "bundle_id",
           "file_digest", "load"]
