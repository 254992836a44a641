"""Plots of profiler outputs (matplotlib, Agg backend; training-side only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_layer_precision", "plot_split_quantization"]


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


def plot_layer_precision(profile: dict[str, Any], png: str | Path, synthetic: bool = False) -> Path:
    """Per-layer latency (alone, optimised batch size) and accuracy drop per precision.

    The chosen assignment is marked under each layer; the title gives its measured whole-model
    speedup and drop.

    Examples:
        >>> profile = profile_layer_precision(model, val_loader)  # doctest: +SKIP
        >>> plot_layer_precision(profile, "runs/x/layer_precision.png", synthetic=True)  # doctest: +SKIP
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = profile["layers"]
    names = [r["name"] for r in rows]
    precisions = profile["precisions"]
    key = str(profile["optimised_batch_size"])
    chosen = profile["assignment"]["layers"]
    fig, (ax_t, ax_d) = plt.subplots(2, 1, figsize=(1.5 + 0.55 * len(names), 6.2), sharex=True)
    width = 0.8 / len(precisions)
    x = np.arange(len(names))
    for k, prec in enumerate(precisions):
        entries = [next(p for p in r["per_precision"] if p["precision"] == prec) for r in rows]
        lat = [e["latency_ms"][key] if e["supported"] else np.nan for e in entries]
        drop = [e["drop_points"] if e["supported"] else np.nan for e in entries]
        ax_t.bar(x + (k - (len(precisions) - 1) / 2) * width, lat, width, label=prec)
        ax_d.bar(x + (k - (len(precisions) - 1) / 2) * width, drop, width, label=prec)
    ax_t.set_ylabel(f"layer alone, ms per batch of {key}")
    ax_t.set_yscale("log")
    ax_t.grid(alpha=0.3, axis="y")
    ax_t.legend(fontsize=7)
    ax_d.axhline(0, color="black", lw=0.6)
    ax_d.set_ylabel("accuracy drop (points)\nthat layer switched alone")
    ax_d.grid(alpha=0.3, axis="y")
    ax_d.set_xticks(x, [f"{n}\n[{chosen.get(n, 'float32')}]" for n in names], rotation=60, fontsize=6, ha="right")
    a = profile["assignment"]
    title = (f"chosen [in brackets] within {a['budget_points']:g} pt: measured drop {a['drop_points']:.2f} pt, "
             f"speedup {a['speedup'][key]:.2f}x at batch {key}; {profile['samples']} samples, "
             f"{profile['machine']['torch_threads']} thread(s)")
    ax_t.set_title(title + (" (synthetic data)" if synthetic else ""), fontsize=8)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
