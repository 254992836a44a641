"""nestflex's own tiny ViT for the transformer tests (issue 40): patch embedding, pre-norm blocks
of multi-head self-attention and a GELU MLP on the residual token stream, mean-pooled tokens (a
ViT without a class token, as DeiT III's and timm's ``global_pool="avg"`` models), LayerNorm,
linear. Written with the model's own constants (no ``x.shape`` reads), as an exported program
needs them; runs on a 3x16x16 input in milliseconds."""

from __future__ import annotations

import torch
from torch import nn

SHAPE = (3, 16, 16)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, tokens: int) -> None:
        super().__init__()
        self.heads, self.tokens, self.dim = heads, tokens, dim
        self.scale = (dim // heads) ** -0.5
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # (N, T, C) -> (N, heads, T, C / heads)
        return t.reshape(-1, self.tokens, self.heads, self.dim // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        attn = ((q @ k.transpose(2, 3)) * self.scale).softmax(-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(-1, self.tokens, self.dim))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, tokens: int) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, tokens)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    """Four blocks of width 16, two heads, 4x4 patches of a 3x16x16 input (16 tokens)."""

    def __init__(self, num_classes: int = 4, dim: int = 16, depth: int = 4, heads: int = 2, patch: int = 4) -> None:
        super().__init__()
        self.input_shape = SHAPE
        tokens = (SHAPE[1] // patch) * (SHAPE[2] // patch)
        self.patch = nn.Conv2d(SHAPE[0], dim, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*(Block(dim, heads, tokens) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.blocks(t)).mean(1))


def tokens_task(n: int, seed: int, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy images whose class is which quadrant is bright (learnable in a few steps)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = torch.randn(n, *SHAPE, generator=g) * 0.3
    for i, c in enumerate(y.tolist()):
        r, q = divmod(c, 2)
        x[i, :, 8 * r:8 * r + 8, 8 * q:8 * q + 8] += 1.0
    return x, y
