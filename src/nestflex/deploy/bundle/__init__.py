"""The bundle format: records (:mod:`.schema`), the loader (:mod:`.loader`), and the program it
describes checked as a network (:mod:`.program`). The bottom layer of the runtime: it imports no
other part of :mod:`nestflex.deploy` but the registry helper, and every other part reads bundles
through it.
"""

from nestflex.deploy.bundle.loader import EXIT_SETS, MAX_MANIFEST_BYTES, Bundle, bundle_id, file_digest, load
from nestflex.deploy.bundle.schema import SCHEMA_VERSION, BundleError, Manifest

__all__ = ["SCHEMA_VERSION", "EXIT_SETS", "MAX_MANIFEST_BYTES", "Bundle", "BundleError", "Manifest", "bundle_id",
           "file_digest", "load"]
