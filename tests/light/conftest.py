"""The light tests: the device side on the base install (numpy + onnxruntime, no torch, no onnx),
against references the torch training model wrote (``make_bundles.py``).

Where the bundles come from:

* ``NESTFLEX_LIGHT_BUNDLES=DIR`` (``.ci/light``): ``DIR`` was written beforehand by
  ``python tests/light/make_bundles.py DIR`` in the full venv; nothing here needs torch.
* otherwise (the full test run): built once per session into a temporary directory, with torch.

Nothing in this folder imports torch at module level: ``.ci/light`` runs it with
``--confcutdir tests/light`` so that ``tests/conftest.py`` (which does) is not loaded.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ENV = "NESTFLEX_LIGHT_BUNDLES"
BUNDLE_NAMES = ("shipped", "derived")  # make_bundles.BUNDLES, without importing it here
#: parity with the torch reference (absolute, float32 logits of a few units)
ATOL = 1e-4


@dataclass
class Refs:
    """``references.npz`` and the bundles beside it."""

    root: Path

    @cached_property
    def arrays(self) -> Any:
        return np.load(self.root / "references.npz", allow_pickle=False)

    @cached_property
    def meta(self) -> dict[str, Any]:
        return json.loads(str(self.arrays["meta"]))

    def __call__(self, bundle: str, key: str) -> np.ndarray:
        return self.arrays[f"{bundle}.{key}"]


@dataclass
class Case:
    """One bundle of the light set: its path, its references and its description."""

    name: str
    refs: Refs

    @property
    def path(self) -> Path:
        return self.refs.root / f"{self.name}.nfx"

    @property
    def meta(self) -> dict[str, Any]:
        return self.refs.meta[self.name]

    @property
    def x(self) -> np.ndarray:
        return self.ref("x")

    def ref(self, key: str) -> np.ndarray:
        return self.refs(self.name, key)

    @cached_property
    def bundle(self) -> Any:
        import nestflex.deploy as nd

        return nd.load(self.path)

    def policies(self, key: str) -> list[dict[str, Any]]:
        return self.meta["exit_sets"][key]["policies"]

    def shared_sets(self) -> list[str]:
        return [k for k, ex in self.meta["exit_sets"].items() if ex["backbone"] == "shared"]


def _build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("torch") is None:
        pytest.fail(f"the light tests need bundles: set {ENV}=DIR to a directory written by "
                    f"`python tests/light/make_bundles.py DIR` in the full venv (this one has no torch to "
                    f"build them). HINT: .ci/light does both steps", pytrace=False)
    from tests.light.make_bundles import make

    return make(tmp_path_factory.mktemp("light_bundles"))


@pytest.fixture(scope="session")
def refs(tmp_path_factory: pytest.TempPathFactory) -> Refs:
    given = os.environ.get(ENV)
    root = Path(given) if given else _build(tmp_path_factory)
    missing = [n for n in (*(f"{b}.nfx" for b in BUNDLE_NAMES), "references.npz") if not (root / n).exists()]
    if missing:
        pytest.fail(f"{ENV}={given!r} lacks {', '.join(missing)}. HINT: python tests/light/make_bundles.py DIR "
                    f"in the full venv", pytrace=False)
    return Refs(root)


@pytest.fixture(params=BUNDLE_NAMES)
def case(request: pytest.FixtureRequest, refs: Refs) -> Case:
    return Case(request.param, refs)


def assert_parity(got: Any, want: np.ndarray, what: str) -> None:
    """``got`` (a numpy array) equals the torch reference ``want`` within :data:`ATOL`."""
    assert isinstance(got, np.ndarray), f"{what}: got a {type(got).__module__}.{type(got).__name__}, not numpy"
    assert got.shape == want.shape, f"{what}: shape {got.shape}, reference {want.shape}"
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=what)


def assert_answers(got: Any, case: Case, key: str, policy: str, rows: Any = slice(None), what: str = "") -> None:
    """An :class:`~nestflex.deploy.ExitResult` equals the reference early exit ``policy`` of exit set
    ``key`` (``rows`` of it): logits within :data:`ATOL`, exit and answer indices exactly."""
    what = what or f"{case.name} {key} {policy}"
    base = f"{key}.ee.{policy}"
    assert_parity(got.logits, case.ref(f"{base}.logits")[rows], f"{what}: logits")
    for field in ("exit_index", "answer_index"):
        value = getattr(got, field)
        assert isinstance(value, np.ndarray), f"{what}: {field} is a {type(value).__name__}, not numpy"
        np.testing.assert_array_equal(value, case.ref(f"{base}.{field}")[rows], err_msg=f"{what}: {field}")
