"""SyntheticShapes: a deterministic 10-class, 32x32 RGB image dataset rendered from a seed.

It is the offline default of nestflex: no files, no downloads, the same bytes for the same
``(seed, split, index)`` (on a different CPU or torch build, vectorised ``sin``/``exp`` may
round differently and move a rare pixel by one level). Images have real visual structure, so
accuracy, early-exit and pruning figures measured on it behave like those on a natural dataset,
only labelled ``synthetic``:

* **Class** = a shape, and for two classes a texture on a shape that also occurs solid
  (``square`` vs ``striped_square``, ``disk`` vs ``checker_disk``). Each class draws its colour
  from a palette of three hues out of eight, and every hue is shared by three or four classes, so
  colour alone is not enough.
* **Nuisances**, each scaled by a per-sample difficulty ``d`` in [0, 1]: position, scale,
  rotation, anisotropic stretch, object/background contrast, colour jitter, background texture
  (low-frequency blotches and stripes), distractor shapes of other kinds (behind and in front of
  the object), occluding patches, spurious texture on solid classes (and faded texture on textured
  ones), blur, global contrast/brightness and pixel noise.
* **Difficulty** is drawn uniformly on [0, 1], so every quintile holds a fifth of the samples:
  ``d < 0.2`` images are clean, centred, upright shapes; ``d > 0.8`` images are small or
  stretched, low-contrast, cluttered, occluded and noisy, and some are genuinely ambiguous.

Rendering is vectorised: a chunk of :data:`CHUNK_SIZE` samples is drawn at once on coordinate
grids. Each chunk has its own :class:`torch.Generator`, seeded from ``(seed, split, chunk index)``,
and every chunk is always rendered whole, so sample ``i`` does not depend on how many samples are
asked for (a smaller set is a prefix of a bigger one) and the train and test splits differ.

Examples:
    >>> from nestflex.data.synthetic import SYNTHETIC_CLASSES, SyntheticShapes, make_synthetic
    >>> images, targets, difficulty = make_synthetic(8, seed=0, split="test")
    >>> images.shape, images.dtype
    (torch.Size([8, 3, 32, 32]), torch.uint8)
    >>> ds = SyntheticShapes("test", size=8)
    >>> x, y = ds[0]
    >>> x.shape, x.dtype, ds.classes[y] == SYNTHETIC_CLASSES[y]
    (torch.Size([3, 32, 32]), torch.float32, True)
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from nestflex.data._dataset import ImageTensorDataset
from nestflex.errors import DataError

__all__ = [
    "SYNTHETIC_CLASSES",
    "SYNTHETIC_MEAN",
    "SYNTHETIC_STD",
    "SYNTHETIC_TRAIN_SIZE",
    "SYNTHETIC_TEST_SIZE",
    "CHUNK_SIZE",
    "IMAGE_SIZE",
    "SyntheticShapes",
    "make_synthetic",
]

#: Class names, index = label.
SYNTHETIC_CLASSES: tuple[str, ...] = (
    "disk",
    "ring",
    "square",
    "triangle",
    "cross",
    "bar",
    "crescent",
    "star",
    "striped_square",
    "checker_disk",
)

#: Per-channel mean/std of the default train split (50,000 samples, seed 0), in [0, 1] units.
#: Measured once with ``make_synthetic(50_000, 0, "train")`` and fixed here, so normalisation
#: does not need the train set to be generated first; ``tests/data`` checks they still match.
SYNTHETIC_MEAN: tuple[float, float, float] = (0.5084, 0.4945, 0.4874)
SYNTHETIC_STD: tuple[float, float, float] = (0.2266, 0.2136, 0.2245)

SYNTHETIC_TRAIN_SIZE = 50_000
SYNTHETIC_TEST_SIZE = 10_000

#: Samples rendered per chunk (per generator). Part of the dataset's definition: changing it
#: changes the bytes of every sample after the first chunk.
CHUNK_SIZE = 1000

IMAGE_SIZE = 32

_SPLITS = ("train", "test")

# Shape kinds drawn by the renderer; classes map onto them, distractors use all of them.
_DISK, _RING, _SQUARE, _TRIANGLE, _CROSS, _BAR, _CRESCENT, _STAR = range(8)
_NUM_SHAPES = 8
_CLASS_SHAPE = torch.tensor(
    [_DISK, _RING, _SQUARE, _TRIANGLE, _CROSS, _BAR, _CRESCENT, _STAR, _SQUARE, _DISK]
)
# 0 = solid, 1 = stripes, 2 = checker.
_CLASS_TEXTURE = torch.tensor([0, 0, 0, 0, 0, 0, 0, 0, 1, 2])

# Eight saturated hues; each class owns three of them, each hue is shared by 3-4 classes.
_HUES = torch.tensor(
    [
        [0.90, 0.15, 0.15],  # red
        [0.95, 0.55, 0.10],  # orange
        [0.95, 0.90, 0.20],  # yellow
        [0.20, 0.80, 0.25],  # green
        [0.15, 0.80, 0.85],  # cyan
        [0.20, 0.35, 0.95],  # blue
        [0.60, 0.25, 0.85],  # purple
        [0.95, 0.45, 0.70],  # pink
    ]
)
_CLASS_PALETTE = torch.tensor([[k % 8, (k + 2) % 8, (k + 5) % 8] for k in range(10)])


def _chunk_seed(seed: int, split: str, chunk: int) -> int:
    # A cryptographic hash decorrelates neighbouring (seed, chunk) pairs, which a linear
    # combination would not, and is stable across Python versions (unlike hash()).
    digest = hashlib.sha256(f"nestflex.synthetic/v1/{seed}/{split}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# --------------------------------------------------------------------------------------------
# Signed distance functions in canonical object coordinates (object radius ~ 1).
# Exactness outside the shape does not matter: they only feed a one-pixel antialiasing ramp.
# --------------------------------------------------------------------------------------------


def _box(u: torch.Tensor, v: torch.Tensor, hx: float, hy: float) -> torch.Tensor:
    qx, qy = u.abs() - hx, v.abs() - hy
    outside = torch.sqrt(qx.clamp(min=0) ** 2 + qy.clamp(min=0) ** 2)
    return outside + torch.maximum(qx, qy).clamp(max=0)


def _shape_sdf(kind: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    if kind in (_DISK, _RING, _CRESCENT):
        rho = torch.sqrt(u * u + v * v)
        if kind == _DISK:
            return rho - 1.0
        if kind == _RING:
            return (rho - 0.70).abs() - 0.30
        bite = torch.sqrt((u - 0.5) ** 2 + v * v) - 0.78
        return torch.maximum(rho - 1.0, -bite)
    if kind == _SQUARE:
        return _box(u, v, 0.82, 0.82)
    if kind == _TRIANGLE:
        # Equilateral, circumradius 1.15, pointing up (image y grows downwards); shifted so its
        # bounding box, not its centroid, sits at the object centre.
        w = v - 0.2875
        return torch.maximum(torch.maximum(w, 0.866 * u - 0.5 * w), -0.866 * u - 0.5 * w) - 0.575
    if kind == _CROSS:
        return torch.minimum(_box(u, v, 0.95, 0.30), _box(u, v, 0.30, 0.95))
    if kind == _BAR:
        return _box(u, v, 1.08, 0.34)
    if kind == _STAR:
        sector = 2 * math.pi / 5
        ang = torch.atan2(v, u) + math.pi / 2  # a point straight up
        a = (torch.remainder(ang + sector / 2, sector) - sector / 2).abs() / (sector / 2)
        profile = 0.42 + (1.08 - 0.42) * (1 - a)
        return (torch.sqrt(u * u + v * v) - profile) * 0.6
    raise AssertionError(f"unknown shape kind {kind}")  # internal invariant


def _render_sdf(kinds: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDF of ``kinds[b]`` at ``(u[b], v[b])``, computed one kind at a time on its subset."""
    out = torch.empty_like(u)
    for kind in range(_NUM_SHAPES):
        idx = (kinds == kind).nonzero(as_tuple=True)[0]
        if idx.numel():
            out[idx] = _shape_sdf(kind, u[idx], v[idx])
    return out


def _texture(kind: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Texture value in [0, 1] per pixel: 1 = object colour, 0 = darkest stripe/check.

    ``kind`` is 0 (solid), 1 (stripes) or 2 (checker) per sample; the patterns live in object
    coordinates so they rotate and scale with the object.
    """
    stripes = (torch.sin(u * (2 * math.pi / 0.55)) * 2.5).clamp(-1, 1) * 0.5 + 0.5
    checker = (torch.sin(u * (math.pi / 0.42)) * torch.sin(v * (math.pi / 0.42)) * 4).clamp(-1, 1) * 0.5 + 0.5
    k = kind.view(-1, 1, 1)
    return torch.where(k == 1, stripes, torch.where(k == 2, checker, torch.ones_like(u)))


def _object_coords(
    cx: torch.Tensor,
    cy: torch.Tensor,
    radius: torch.Tensor,
    theta: torch.Tensor,
    stretch: torch.Tensor,
    grid_x: torch.Tensor,
    grid_y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map pixel centres to each object's canonical frame (rotation, anisotropic scale)."""
    dx = grid_x - cx.view(-1, 1, 1)
    dy = grid_y - cy.view(-1, 1, 1)
    c, s = torch.cos(theta).view(-1, 1, 1), torch.sin(theta).view(-1, 1, 1)
    sx = (radius * stretch).view(-1, 1, 1)
    sy = (radius / stretch).view(-1, 1, 1)
    return (c * dx + s * dy) / sx, (-s * dx + c * dy) / sy


def _coverage(sdf: torch.Tensor, radius_px: torch.Tensor) -> torch.Tensor:
    # One-pixel antialiasing ramp: the SDF is in object units, the radius converts it to pixels.
    return (0.5 - sdf * radius_px.view(-1, 1, 1)).clamp_(0, 1)


def _paint(img: torch.Tensor, idx: torch.Tensor, colour: torch.Tensor, alpha: torch.Tensor) -> None:
    """Alpha-blend ``colour`` ((k, 3) or (k, 3, H, W)) over ``img[idx]`` in place."""
    if colour.dim() == 2:
        colour = colour.view(-1, 3, 1, 1).expand(-1, -1, img.shape[2], img.shape[3])
    # lerp is one fused kernel; ``a*(1-w) + b*w`` costs three passes over the image.
    img[idx] = img[idx].lerp_(colour, alpha.unsqueeze(1))


def _box_blur3(x: torch.Tensor) -> torch.Tensor:
    # Separable 3x3 box blur from shifted slices: ~3x faster than F.avg_pool2d on CPU here.
    p = F.pad(x, (1, 1, 1, 1), mode="replicate")
    h = p[..., :, :-2] + p[..., :, 1:-1] + p[..., :, 2:]
    return (h[..., :-2, :] + h[..., 1:-1, :] + h[..., 2:, :]).div_(9)


def _upsample_matrix(n_in: int, n_out: int) -> torch.Tensor:
    # Bilinear upsampling as a (n_out, n_in) matrix: two small matmuls upsample a whole batch far
    # faster than F.interpolate's CPU kernel does on thousands of 4x4 maps.
    eye = torch.eye(n_in).unsqueeze(0)
    return F.interpolate(eye, size=n_out, mode="linear", align_corners=False)[0].T.contiguous()


def _render_chunk(g: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Render one chunk of ``n`` samples from generator ``g``.

    Every random draw has a fixed shape and order whatever the outcome of earlier draws, so the
    result depends only on ``g``'s seed. Layers that only some samples get (distractors, texture,
    occluders, blur) are computed on that subset alone, which is where most of the speed comes from.
    """
    size = IMAGE_SIZE

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g)

    def where(mask: torch.Tensor) -> torch.Tensor:
        return mask.nonzero(as_tuple=True)[0]

    # Exactly balanced labels within each chunk, in random order.
    labels = torch.randperm(n, generator=g) % len(SYNTHETIC_CLASSES)
    d = rand(n)

    coords = torch.arange(size, dtype=torch.float32) + 0.5
    grid_y, grid_x = torch.meshgrid(coords, coords, indexing="ij")

    # ---- background: base colour, low-frequency blotches, sometimes stripes -----------------
    grey = 0.15 + 0.7 * rand(n, 1)
    bg_base = (grey + (rand(n, 3) - 0.5) * 0.25).clamp(0, 1)
    up = _upsample_matrix(4, size)
    blotches = up @ (rand(n, 3, 4, 4) - 0.5) @ up.T
    img = torch.addcmul(bg_base.view(-1, 3, 1, 1), blotches, (0.04 + 0.28 * d).view(-1, 1, 1, 1))
    stripe_amp = (rand(n) < 0.5 * d).float() * (0.22 * d)
    bg_theta = rand(n) * math.pi
    bg_freq = 2 * math.pi / (3.0 + 4.0 * rand(n))
    sel = where(stripe_amp > 0)
    fx = (torch.cos(bg_theta) * bg_freq)[sel].view(-1, 1, 1)
    fy = (torch.sin(bg_theta) * bg_freq)[sel].view(-1, 1, 1)
    proj = grid_x * fx + grid_y * fy
    img[sel] += (torch.sin_(proj) * stripe_amp[sel].view(-1, 1, 1)).unsqueeze(1)

    # ---- object geometry --------------------------------------------------------------------
    radius = 10.0 * torch.exp((rand(n) - 0.5) * 0.9 * d)  # 10 px when easy, 6.4-15.7 px when hard
    max_offset = 1.0 + 6.0 * d
    cx = size / 2 + (rand(n) * 2 - 1) * max_offset
    cy = size / 2 + (rand(n) * 2 - 1) * max_offset
    theta = (rand(n) * 2 - 1) * math.pi * d
    stretch = torch.exp((rand(n) * 2 - 1) * 0.35 * d)

    # ---- distractors: shapes of any kind, behind (slots 0, 1) or in front (slot 2) -----------
    distractors = []
    for slot in range(3):
        active = rand(n) < (1.5 * d - 0.3 * slot)
        kinds = torch.randint(0, _NUM_SHAPES, (n,), generator=g)
        dr = radius * (0.25 + 0.5 * d * rand(n))
        dcx, dcy = rand(n) * size, rand(n) * size
        dth = rand(n) * 2 * math.pi
        hue = torch.randint(0, len(_HUES), (n,), generator=g)
        strength = 0.35 + 0.65 * rand(n)
        distractors.append((where(active), kinds, dr, dcx, dcy, dth, _HUES[hue], strength))

    def paint_distractor(sel, kinds, dr, dcx, dcy, dth, colour, strength) -> None:  # noqa: ANN001
        if not sel.numel():
            return
        r = dr[sel]
        du, dv = _object_coords(dcx[sel], dcy[sel], r, dth[sel], torch.ones(len(sel)), grid_x, grid_y)
        alpha = _coverage(_render_sdf(kinds[sel], du, dv), r).mul_(strength[sel].view(-1, 1, 1))
        _paint(img, sel, colour[sel], alpha)

    for spec in distractors[:2]:
        paint_distractor(*spec)

    # ---- the object: class shape, class texture (or a spurious one), palette colour ----------
    pal_pick = torch.randint(0, 3, (n,), generator=g)
    colour = _HUES[_CLASS_PALETTE[labels, pal_pick]]
    colour = colour + torch.randn(n, 3, generator=g) * (0.03 + 0.10 * d).view(-1, 1)
    contrast = 1.0 - 0.7 * d * rand(n)
    colour = bg_base + contrast.view(-1, 1) * (colour - bg_base)

    texture = _CLASS_TEXTURE[labels]
    spurious = (texture == 0) & (rand(n) < 0.6 * d)
    texture = torch.where(spurious, 1 + torch.randint(0, 2, (n,), generator=g), texture)
    # Textured classes fade as d grows, solid ones pick up faint texture: at d ~ 1 they overlap.
    tex_depth = torch.where(_CLASS_TEXTURE[labels] > 0, 0.8 - 0.45 * d * rand(n), 0.45 * d * rand(n))

    u, v = _object_coords(cx, cy, radius, theta, stretch, grid_x, grid_y)
    # The ramp follows the object's narrower axis so stretched shapes stay one pixel soft.
    obj_alpha = _coverage(
        _render_sdf(_CLASS_SHAPE[labels], u, v), radius * torch.minimum(stretch, 1 / stretch)
    )
    obj_colour = colour.view(-1, 3, 1, 1).expand(-1, -1, size, size)
    tex = where(texture > 0)
    if tex.numel():
        shade = 1.0 - tex_depth[tex].view(-1, 1, 1) * (1.0 - _texture(texture[tex], u[tex], v[tex]))
        obj_colour = obj_colour.clone()
        obj_colour[tex] *= shade.unsqueeze(1)
    img.lerp_(obj_colour, obj_alpha.unsqueeze(1))

    paint_distractor(*distractors[2])

    # ---- occluding patch near the object ------------------------------------------------------
    occ_on = rand(n) < d
    ox = cx + (rand(n) * 2 - 1) * radius * 0.8
    oy = cy + (rand(n) * 2 - 1) * radius * 0.8
    ow = radius * (0.3 + 0.6 * d * rand(n))
    oh = radius * (0.3 + 0.6 * d * rand(n))
    occ_colour = rand(n, 3)
    sel = where(occ_on)
    occ = ((grid_x - ox[sel].view(-1, 1, 1)).abs() < ow[sel].view(-1, 1, 1)) & (
        (grid_y - oy[sel].view(-1, 1, 1)).abs() < oh[sel].view(-1, 1, 1)
    )
    _paint(img, sel, occ_colour[sel], occ.float())

    # ---- blur, global contrast/brightness, pixel noise ----------------------------------------
    blur_w = (2 * d - 1).clamp(min=0) * rand(n)
    sel = where(blur_w > 0)
    sharp = img[sel]
    img[sel] = _box_blur3(sharp).lerp_(sharp, 1 - blur_w[sel].view(-1, 1, 1, 1))
    gain = 1.0 - 0.5 * d * rand(n)
    shift = (rand(n) * 2 - 1) * 0.15 * d
    # 0.5 + (img - 0.5) * gain + shift, in one fused pass
    img = torch.addcmul((0.5 * (1 - gain) + shift).view(-1, 1, 1, 1), img, gain.view(-1, 1, 1, 1))
    img.addcmul_(torch.randn(n, 3, size, size, generator=g), (0.01 + 0.08 * d).view(-1, 1, 1, 1))

    images = img.clamp_(0, 1).mul_(255).round_().to(torch.uint8)
    return images, labels.to(torch.int64), d


@contextlib.contextmanager
def _single_thread() -> Iterator[None]:
    """Run torch ops on one intra-op thread, then restore the caller's setting.

    The renderer issues many small elementwise kernels. With two threads they are only ~1.3x
    faster on an idle machine, but when another process keeps a core busy each kernel waits for
    the descheduled OpenMP thread and rendering got 3-25x slower (measured on 2 cores), so one
    thread is the robust choice. Results do not depend on the thread count.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def make_synthetic(
    n: int, seed: int = 0, split: str = "train"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Render the first ``n`` samples of a synthetic split.

    Args:
        n: number of samples (>= 0). The first ``n`` samples are the same whatever ``n`` is.
        seed: dataset seed; a different seed gives a different dataset.
        split: ``"train"`` or ``"test"``; the two splits never share a generator.

    Returns:
        ``(images, targets, difficulty)``: uint8 ``(n, 3, 32, 32)``, int64 ``(n,)`` labels in
        0..9, float32 ``(n,)`` difficulty in [0, 1].

    Raises:
        DataError: ``n`` negative or not an int, ``seed`` not an int, unknown ``split``.

    Examples:
        >>> images, targets, difficulty = make_synthetic(4, seed=1, split="test")
        >>> images.shape, targets.tolist() == make_synthetic(10, 1, "test")[1][:4].tolist()
        (torch.Size([4, 3, 32, 32]), True)
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise DataError(f"`n` must be an integer >= 0, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"`seed` must be an integer, got {seed!r}")
    if split not in _SPLITS:
        raise DataError(f"`split` must be one of {list(_SPLITS)}, got {split!r}")
    n_chunks = -(-n // CHUNK_SIZE)
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    with _single_thread():
        for chunk in range(n_chunks):
            g = torch.Generator().manual_seed(_chunk_seed(seed, split, chunk))
            parts.append(_render_chunk(g, CHUNK_SIZE))
    if not parts:
        return (
            torch.empty(0, 3, IMAGE_SIZE, IMAGE_SIZE, dtype=torch.uint8),
            torch.empty(0, dtype=torch.int64),
            torch.empty(0, dtype=torch.float32),
        )
    images, targets, difficulty = (torch.cat(t)[:n].contiguous() for t in zip(*parts))
    return images, targets, difficulty


class SyntheticShapes(ImageTensorDataset):
    """The synthetic dataset as a torch ``Dataset`` of ``(image, label)``.

    Args:
        split: ``"train"`` or ``"test"``.
        size: number of samples; ``None`` means 50,000 for train and 10,000 for test.
        seed: dataset seed.
        transform: callable applied to each uint8 ``(3, 32, 32)`` image; ``None`` returns
            float32 in [0, 1]. See :func:`nestflex.data.train_transform`.

    Attributes:
        images: uint8 ``(N, 3, 32, 32)``.
        targets: int64 ``(N,)``.
        difficulty: float32 ``(N,)`` in [0, 1]; quintiles of it make the accuracy-vs-difficulty
            analysis in ``benchmarks/recipe/synthetic_difficulty.py``.
        classes: class names, index = label.

    Raises:
        DataError: bad ``split``, ``size`` or ``seed``.

    Examples:
        >>> ds = SyntheticShapes("test", size=20, seed=3)
        >>> len(ds), ds.difficulty.shape, ds.classes[:3]
        (20, torch.Size([20]), ('disk', 'ring', 'square'))
    """

    synthetic = True

    def __init__(
        self,
        split: str = "train",
        size: int | None = None,
        seed: int = 0,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        if split not in _SPLITS:
            raise DataError(f"`split` must be one of {list(_SPLITS)}, got {split!r}")
        if size is None:
            size = SYNTHETIC_TRAIN_SIZE if split == "train" else SYNTHETIC_TEST_SIZE
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise DataError(f"`size` must be an integer >= 1 or None, got {size!r}")
        images, targets, difficulty = make_synthetic(size, seed=seed, split=split)
        super().__init__(images, targets, classes=SYNTHETIC_CLASSES, transform=transform)
        self.difficulty = difficulty
        self.split = split
        self.seed = seed
