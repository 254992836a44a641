"""The corruption corpus (nestflex.testing.corruption) against load, the runtime and the CLI: every
damaged bundle is refused with one BundleError, or loads and computes exactly what the good one
computes (or, when the damage rewrote the checksums, at least runs); `nestflex inspect` prints one
`error:` line and exits 2, or shows the bundle."""

from __future__ import annotations

import hashlib
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nestflex.deploy as nd
from nestflex import cli
from nestflex.testing import corruption

KINDS = sorted(corruption.KINDS)
SEEDS = 10  # per kind, in order: with the property test below, ~230 distinct cases in ~15 s


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return corruption.tiny_bundle(tmp_path_factory.mktemp("corpus") / "good.nfx")


@pytest.fixture(scope="module")
def reference(good):
    return corruption.run_outputs(nd.load(good))


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(p.relative_to(root).as_posix().encode())
        if p.is_symlink():
            h.update(str(p.readlink()).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_refused_or_loads_with_identical_outputs(kind, good, reference, tmp_path):
    seen = Counter()
    for seed in range(SEEDS):
        case = corruption.corrupt(good, tmp_path / str(seed) / "b.nfx", kind, seed)
        seen[corruption.outcome(case, reference)] += 1  # raises on any other exception or a silent change
    # each kind does damage load must see, except extra members, which a bundle may carry
    expected = "identical" if kind == "extra_member" else "refused"
    assert seen[expected] >= 1, f"{kind}: no case was {expected} ({dict(seen)})"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), seed=st.integers(SEEDS, 2**32 - 1))
def test_any_case_of_the_corpus_is_refused_or_runs(kind, seed, good, reference):
    with tempfile.TemporaryDirectory() as tmp:
        case = corruption.corrupt(good, Path(tmp) / "b.nfx", kind, seed)
        assert corruption.outcome(case, reference) in ("refused", "identical", "runs")


@pytest.mark.parametrize("kind", ["truncate", "flip_data", "bad_number", "special_file", "safetensors_header"])
def test_a_case_is_the_same_bytes_for_the_same_kind_and_seed(kind, good, tmp_path):
    a = corruption.corrupt(good, tmp_path / "a" / "b.nfx", kind, 7)
    b = corruption.corrupt(good, tmp_path / "b" / "b.nfx", kind, 7)
    c = corruption.corrupt(good, tmp_path / "c" / "b.nfx", kind, 8)
    assert a.description == b.description and _tree_digest(a.path) == _tree_digest(b.path)
    assert _tree_digest(a.path) != _tree_digest(good)
    assert (a.description, _tree_digest(a.path)) != (c.description, _tree_digest(c.path)) or kind == "special_file"


def test_a_changed_output_with_unchanged_checksums_is_caught(good, reference, tmp_path):
    # the checker itself: a damage that is not `consistent` must not load with other outputs
    case = corruption.Case("manual", 0, good, "nothing", consistent=False)
    assert corruption.outcome(case, reference) == "identical"
    other = {k: v + 1 if k.startswith("level_") else v for k, v in reference.items()}
    with pytest.raises(AssertionError, match="loaded with other outputs"):
        corruption.outcome(case, other)


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_prints_one_error_line_and_exits_2_or_shows_the_bundle(kind, good, tmp_path, capsys):
    for seed in range(3):
        case = corruption.corrupt(good, tmp_path / str(seed) / "b.nfx", kind, seed)
        code = cli.main(["inspect", str(case.path)])
        out, err = capsys.readouterr()
        if code == 0:
            assert err == "" and out.startswith(f"bundle {case.path}"), case
        else:
            lines = err.splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith("error: bundle "), (case, err[:500])
