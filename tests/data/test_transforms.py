"""Augmentation and normalisation in plain torch."""

from __future__ import annotations

import pytest
import torch

from nestflex.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    Compose,
    Normalize,
    Pad,
    RandomCropFlip,
    compute_mean_std,
    eval_transform,
    pad,
    random_crop_flip,
    to_float,
    train_transform,
)
from nestflex.errors import DataError


def _images(b: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (b, 3, 32, 32), dtype=torch.uint8, generator=g)


def _reference_crop_flip(x: torch.Tensor, top: int, left: int, flip: bool, padding: int = 4) -> torch.Tensor:
    padded = torch.nn.functional.pad(x, (padding,) * 4)
    out = padded[:, top : top + x.shape[1], left : left + x.shape[2]]
    return out.flip(-1) if flip else out


def test_crop_flip_matches_reference_per_image():
    x = _images()
    g = torch.Generator().manual_seed(5)
    out = random_crop_flip(x, generator=g)
    # Replay the same draws: offsets for the batch, then flips.
    g2 = torch.Generator().manual_seed(5)
    top = torch.randint(0, 9, (6,), generator=g2)
    left = torch.randint(0, 9, (6,), generator=g2)
    flips = torch.rand(6, generator=g2) < 0.5
    for i in range(6):
        assert torch.equal(out[i], _reference_crop_flip(x[i], int(top[i]), int(left[i]), bool(flips[i])))
    assert out.dtype == torch.uint8 and out.shape == x.shape


def test_single_image_and_batch_use_the_same_code():
    x = _images(1)
    a = random_crop_flip(x[0], generator=torch.Generator().manual_seed(3))
    b = random_crop_flip(x, generator=torch.Generator().manual_seed(3))[0]
    assert a.shape == (3, 32, 32) and torch.equal(a, b)


def test_no_padding_no_flip_is_identity():
    x = _images()
    assert torch.equal(random_crop_flip(x, padding=0, flip=False), x)


def test_crop_flip_is_seeded_and_varied():
    x = _images(64)
    t1 = RandomCropFlip(generator=torch.Generator().manual_seed(0))
    t2 = RandomCropFlip(generator=torch.Generator().manual_seed(0))
    a, b = t1(x), t2(x)
    assert torch.equal(a, b)
    assert not torch.equal(t1(x), a)  # the generator advances
    assert (a != x).flatten(1).any(1).float().mean() > 0.8  # most images moved or flipped


def test_flip_only():
    x = _images(200)
    out = random_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(0))
    flipped = torch.tensor([torch.equal(o, i.flip(-1)) for o, i in zip(out, x)])
    same = torch.tensor([torch.equal(o, i) for o, i in zip(out, x)])
    assert bool((flipped | same).all()) and 0.35 < flipped.float().mean() < 0.65


def test_normalize_uint8_and_float_agree():
    x = _images()
    norm = Normalize(CIFAR10_MEAN, CIFAR10_STD)
    a, b = norm(x), norm(to_float(x))
    assert a.dtype == torch.float32 and torch.allclose(a, b)
    expected = (x[:, 1].float() / 255 - CIFAR10_MEAN[1]) / CIFAR10_STD[1]
    assert torch.allclose(a[:, 1], expected, atol=1e-6)
    assert torch.allclose(norm(x[0]), a[0])


def test_normalized_statistics():
    x = _images(256)
    mean, std = compute_mean_std(x)
    out = eval_transform(mean, std)(x)
    assert torch.allclose(out.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-3)
    assert torch.allclose(out.std(dim=(0, 2, 3)), torch.ones(3), atol=1e-2)


def test_compute_mean_std_matches_torch():
    x = _images(100)
    mean, std = compute_mean_std(x, chunk=7)
    f = x.double() / 255
    assert torch.allclose(torch.tensor(mean, dtype=torch.float64), f.mean(dim=(0, 2, 3)), atol=1e-4)
    reference_std = f.std(dim=(0, 2, 3), unbiased=False)
    assert torch.allclose(torch.tensor(std, dtype=torch.float64), reference_std, atol=1e-4)


def test_train_transform_pipeline():
    t = train_transform(CIFAR10_MEAN, CIFAR10_STD, generator=torch.Generator().manual_seed(0))
    assert isinstance(t, Compose) and "RandomCropFlip" in repr(t)
    out = t(_images())
    assert out.dtype == torch.float32 and out.shape == (6, 3, 32, 32)


def test_pad_adds_a_zero_border():
    x = torch.full((2, 1, 28, 28), 7, dtype=torch.uint8)
    out = pad(x, 2)
    assert out.shape == (2, 1, 32, 32) and out.dtype == torch.uint8
    assert torch.equal(out[:, :, 2:30, 2:30], x) and out.sum() == x.sum()  # zeros around
    assert torch.equal(Pad(2)(x[0]), out[0]) and repr(Pad(2)) == "Pad(2)" and pad(x, 0) is x


def test_greyscale_pipelines_with_a_border_and_no_flip():
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    plain = eval_transform((0.1307,), (0.3081,), border=2)
    assert plain(x).shape == (4, 1, 32, 32) and "Pad(2)" in repr(plain)
    torch.testing.assert_close(plain(x)[:, :, 2:30, 2:30], (x.float() / 255 - 0.1307) / 0.3081)
    t = train_transform((0.1307,), (0.3081,), padding=2, generator=torch.Generator().manual_seed(0), flip=False,
                        border=2)
    assert repr(t).startswith("Compose(Pad(2), RandomCropFlip(padding=2, flip=False)")
    out = t(x)
    assert out.shape == (4, 1, 32, 32)
    # each image is a shift of the padded original, never a mirror image
    padded = torch.nn.functional.pad(plain(x), (2, 2, 2, 2), value=-0.1307 / 0.3081)
    for i in range(4):
        assert any(torch.allclose(out[i], padded[i, :, r: r + 32, c: c + 32]) for r in range(5) for c in range(5))


def test_errors():
    with pytest.raises(DataError, match=r"`std` must be > 0 for every channel, got \(0\.1, 0\.0, 0\.1\)"):
        Normalize((0.5, 0.5, 0.5), (0.1, 0.0, 0.1))
    with pytest.raises(DataError, match=r"`mean` and `std` must have the same non-zero length"):
        Normalize((0.5,), (0.1, 0.1))
    with pytest.raises(DataError, match=r"expected 3 channels, got image shape \(1, 32, 32\)"):
        Normalize(CIFAR10_MEAN, CIFAR10_STD)(torch.zeros(1, 32, 32))
    with pytest.raises(DataError, match=r"`padding` must be an integer >= 0, got -1"):
        RandomCropFlip(padding=-1)
    with pytest.raises(DataError, match=r"`border` must be an integer >= 0, got -2"):
        Pad(-2)
    with pytest.raises(DataError, match=r"`border` must be an integer >= 0, got 1.5"):
        pad(torch.zeros(1, 4, 4), 1.5)
    match = r"expected an image \(C, H, W\) or a batch \(B, C, H, W\), got shape \(32, 32\)"
    with pytest.raises(DataError, match=match):
        random_crop_flip(torch.zeros(32, 32))
    with pytest.raises(DataError, match=r"`images` must be a non-empty \(N, C, H, W\) tensor"):
        compute_mean_std(torch.zeros(0, 3, 32, 32, dtype=torch.uint8))
