"""The synthetic dataset: determinism, prefix property, balance, difficulty, and real structure."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from nestflex.data import SYNTHETIC_MEAN, SYNTHETIC_STD, SyntheticShapes, compute_mean_std, make_synthetic
from nestflex.data.synthetic import CHUNK_SIZE, SYNTHETIC_CLASSES
from nestflex.errors import DataError


@pytest.fixture(scope="module")
def train_2k():
    return make_synthetic(2000, seed=0, split="train")


def test_shapes_and_dtypes(train_2k):
    images, targets, difficulty = train_2k
    assert images.shape == (2000, 3, 32, 32) and images.dtype == torch.uint8
    assert targets.shape == (2000,) and targets.dtype == torch.int64
    assert difficulty.shape == (2000,) and difficulty.dtype == torch.float32
    assert int(targets.min()) == 0 and int(targets.max()) == 9
    assert images.is_contiguous()


def test_same_seed_same_bytes_different_seed_differs(train_2k):
    again = make_synthetic(300, seed=0, split="train")
    for a, b in zip(again, train_2k):
        assert torch.equal(a, b[:300])
    other = make_synthetic(300, seed=1, split="train")
    assert not torch.equal(other[0], again[0])
    assert (other[0] != again[0]).float().mean() > 0.5


def test_prefix_property_across_chunks(train_2k):
    n = CHUNK_SIZE + 37  # ends inside the second chunk
    small = make_synthetic(n, seed=0, split="train")
    for a, b in zip(small, train_2k):
        assert torch.equal(a, b[:n])


def test_train_and_test_differ(train_2k):
    test_images, _, _ = make_synthetic(300, seed=0, split="test")
    assert (test_images != train_2k[0][:300]).float().mean() > 0.5


def test_labels_balanced(train_2k):
    counts = torch.bincount(train_2k[1], minlength=10)
    assert counts.tolist() == [200] * 10  # exactly balanced within every chunk
    part = torch.bincount(train_2k[1][:500], minlength=10)
    assert int(part.min()) >= 30 and int(part.max()) <= 70  # and shuffled within it


def test_difficulty_spread(train_2k):
    d = train_2k[2]
    assert float(d.min()) >= 0.0 and float(d.max()) <= 1.0
    assert float(d.std()) > 0.25
    quintiles = torch.histc(d, bins=5, min=0, max=1) / len(d)
    assert bool((quintiles > 0.15).all())


def test_hard_images_are_noisier_and_easy_ones_plain(train_2k):
    images, _, d = train_2k
    # High-frequency energy (neighbour differences) grows with difficulty: noise, clutter.
    x = images.float()
    hf = ((x[..., 1:] - x[..., :-1]).abs().mean(dim=(1, 2, 3)))
    assert float(hf[d > 0.8].mean()) > 2 * float(hf[d < 0.2].mean())


def test_generation_is_fast():
    t0 = time.perf_counter()
    make_synthetic(3000, seed=5, split="test")
    elapsed = time.perf_counter() - t0
    # ~0.2 s on 2 free cores; the bound only catches an accidental slow path (e.g. a per-sample loop).
    assert elapsed < 30, f"3000 synthetic images took {elapsed:.1f} s"


def test_mean_std_constants_match_the_data(train_2k):
    mean, std = compute_mean_std(train_2k[0])
    assert torch.allclose(torch.tensor(mean), torch.tensor(SYNTHETIC_MEAN), atol=0.01)
    assert torch.allclose(torch.tensor(std), torch.tensor(SYNTHETIC_STD), atol=0.01)


def _features(images: torch.Tensor) -> torch.Tensor:
    f = F.avg_pool2d(images.float() / 255, 2)
    f = f - f.mean(dim=(1, 2, 3), keepdim=True)
    return (f / f.flatten(1).norm(dim=1).clamp(min=1e-6).view(-1, 1, 1, 1)).flatten(1)


def test_has_learnable_structure_easy_beats_hard():
    """A linear classifier on raw pixels learns the easy samples, not the hard ones."""
    torch.manual_seed(0)
    xtr, ytr, dtr = make_synthetic(3000, seed=0, split="train")
    xte, yte, dte = make_synthetic(2000, seed=0, split="test")
    ftr, fte = _features(xtr), _features(xte)
    easy = dtr < 0.3
    w = torch.zeros(ftr.shape[1], 10, requires_grad=True)
    b = torch.zeros(10, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=0.01)
    for _ in range(150):
        loss = F.cross_entropy(ftr[easy] @ w * 10 + b, ytr[easy])
        opt.zero_grad()
        loss.backward()
        opt.step()
    correct = (fte @ w * 10 + b).argmax(1) == yte
    acc_easy = float(correct[dte < 0.2].float().mean())
    acc_hard = float(correct[dte > 0.8].float().mean())
    assert acc_easy > 0.3, acc_easy  # chance is 0.1
    assert acc_easy > acc_hard + 0.15, (acc_easy, acc_hard)


def test_dataset_api():
    ds = SyntheticShapes("test", size=50, seed=2)
    assert len(ds) == 50 and ds.classes == SYNTHETIC_CLASSES and ds.synthetic is True
    assert ds.difficulty.shape == (50,) and ds.split == "test" and ds.seed == 2
    images, targets, difficulty = make_synthetic(50, seed=2, split="test")
    assert torch.equal(ds.images, images) and torch.equal(ds.targets, targets)
    assert torch.equal(ds.difficulty, difficulty)
    x, y = ds[7]
    assert x.dtype == torch.float32 and x.shape == (3, 32, 32) and float(x.max()) <= 1.0
    assert y == int(targets[7]) and isinstance(y, int)
    ds_t = SyntheticShapes("test", size=5, transform=lambda im: im.float() - 1000)
    assert float(ds_t[0][0].max()) < 0


def test_default_sizes(monkeypatch):
    # size=None means the split's default; check it without rendering 50k images.
    from nestflex.data import synthetic

    seen = []
    def fake(n, seed, split):
        seen.append((n, split))
        return make_synthetic(2)

    monkeypatch.setattr(synthetic, "make_synthetic", fake)
    synthetic.SyntheticShapes("train")
    synthetic.SyntheticShapes("test")
    assert seen == [(50_000, "train"), (10_000, "test")]


def test_empty_request():
    images, targets, difficulty = make_synthetic(0)
    assert images.shape == (0, 3, 32, 32) and len(targets) == 0 and len(difficulty) == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n": -1}, r"`n` must be an integer >= 0, got -1"),
        ({"n": 2.5}, r"`n` must be an integer >= 0, got 2\.5"),
        ({"n": 5, "seed": "0"}, r"`seed` must be an integer, got '0'"),
        ({"n": 5, "split": "val"}, r"`split` must be one of \['train', 'test'\], got 'val'"),
    ],
)
def test_make_synthetic_errors(kwargs, match):
    with pytest.raises(DataError, match=match):
        make_synthetic(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"split": "valid"}, r"`split` must be one of \['train', 'test'\], got 'valid'"),
        ({"size": 0}, r"`size` must be an integer >= 1 or None, got 0"),
        ({"size": 10, "transform": 3}, r"`transform` must be callable or None, got 3"),
    ],
)
def test_dataset_errors(kwargs, match):
    with pytest.raises(DataError, match=match):
        SyntheticShapes(**kwargs)
