"""Plots of profiler outputs (matplotlib, Agg backend; training-side only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_split_quantization"]


def plot_split_quantization(profile: dict[str, Any], png: str | Path, synthetic: bool = False) -> Path:
    """Heat map of accuracy drop (points) per split (rows) and bitwidth (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bits = [b for b in profile["bitwidths"] if b is not None]
    names = [row["name"] for row in profile["splits"]]
    drops = np.array(
        [[next(r["drop_points"] for r in row["per_bits"] if r["bits"] == b) for b in bits] for row in profile["splits"]]
    )
    fig, ax = plt.subplots(figsize=(1.0 + 0.7 * len(bits), 1.2 + 0.32 * len(names)))
    im = ax.imshow(np.clip(drops, 0, 10), cmap="magma_r", vmin=0, vmax=10, aspect="auto")
    for i in range(len(names)):
        for j in range(len(bits)):
            ax.text(j, i, f"{drops[i, j]:.1f}", ha="center", va="center", fontsize=6,
                    color="white" if drops[i, j] > 5 else "black")
    ax.set_xticks(range(len(bits)), [str(b) for b in bits])
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("ISQuant bitwidth at the split")
    title = f"accuracy drop (points) vs float, {profile['samples']} samples"
    ax.set_title(title + (" (synthetic data)" if synthetic else ""), fontsize=8)
    fig.colorbar(im, ax=ax, label="drop (points, clipped at 10)")
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
