"""The FlexDNN spec and the files of a run: rebuild the planned network from them.

:func:`~nestflex.exits.flexdnn.flexdnn` describes its planned exits as a JSON spec (which layer
each exit taps, which of its filters it reads, the widths of its conv blocks, the thresholds and
the policy); :class:`~nestflex.exits.flexdnn.FlexDNNExits` writes it as ``spec.json`` beside the
planned network's weights, ``model.safetensors``. Two calls rebuild the network:

* :func:`load_flex_network`: the network from the files, weights loaded, on a plain or a grown
  (nested, multi-capacity) backbone: the one call for a new process;
* :func:`build_flex_network`: the network from a spec, weights not loaded (the exporter and the
  tests fill them in).

The exits of a grown network are planned on a plain copy of its largest level (the level a
bundle shares with them), so both calls put them on that level: the weights file names its
tensors as the plain network does (``backbone.features.0.weight``), not as the nested one
(``backbone.features.0.levels.0.weight``).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from torch import nn

from nestflex.deploy.exits import ExitError
from nestflex.exits.flexdnn.fine_grained import CompactHead, FilterSubsetExit
from nestflex.exits.model import MultiExitNetwork

__all__ = ["SPEC_FILE", "WEIGHTS_FILE", "build_flex_network", "load_flex_network"]

#: the spec's file name in the directory :class:`~nestflex.exits.flexdnn.FlexDNNExits` writes
SPEC_FILE = "spec.json"
#: the planned network's ``state_dict`` there (absent when the plan keeps no exit)
WEIGHTS_FILE = "model.safetensors"


class _Prebuilt:
    """A head 'factory' handing out already-built exits in order (MultiExitNetwork builds heads
    in execution order), so the planned exits enter the standard module unchanged."""

    def __init__(self, heads: Sequence[nn.Module]) -> None:
        self.heads = list(heads)

    def __call__(self, in_shape, num_classes, **_: Any) -> nn.Module:
        return self.heads.pop(0)


def _plain(backbone: nn.Module) -> nn.Module:
    """``backbone``, or a plain copy of its largest level when it is a grown (nested) network."""
    # function level: nestflex.capacity's package imports Lightning, nestflex.exits needs torch alone
    from nestflex.capacity.nested import extract_level, is_nested, num_levels

    return extract_level(backbone, num_levels(backbone) - 1) if is_nested(backbone) else backbone


def _plain_copy(backbone: nn.Module) -> nn.Module:
    """A plain copy of ``backbone`` (of a grown network, its largest level): what the exits are
    planned on and rebuilt on, so the caller's network is never changed."""
    plain = _plain(backbone)
    return copy.deepcopy(backbone) if plain is backbone else plain


def build_flex_network(backbone: nn.Module, spec: Mapping[str, Any]) -> MultiExitNetwork:
    """Rebuild the planned network from its spec; its weights are not loaded.

    Args:
        backbone: the classifier the exits were planned on. A plain one is used as is (not
            copied); of a grown (nested, multi-capacity) network, a plain copy of its largest
            level, where :class:`~nestflex.exits.flexdnn.FlexDNNExits` plans them.
        spec: the FlexDNN spec (``FlexDNNResult.spec``, or ``spec.json`` read back).

    Returns:
        the :class:`~nestflex.exits.MultiExitNetwork` of the planned exits, in eval mode, with
        freshly initialised heads: load the weights with ``load_state_dict`` (or rebuild with
        :func:`load_flex_network`, which does both).

    Raises:
        ExitError: a spec without exits (the plan kept none), or one that lacks a key.

    Examples:
        >>> import torch
        >>> from torch import nn
        >>> backbone = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
        ...                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
        >>> spec = {"num_classes": 10, "input_shape": [1, 16, 16], "confidence": "entropy", "thresholds": [0.3],
        ...         "fallback": "final", "exits": [{"location": "1", "filters": [5, 2], "widths": [4], "in_hw": [16, 16]}]}
        >>> net = build_flex_network(backbone, spec)
        >>> [tuple(z.shape) for z in net(torch.randn(2, 1, 16, 16))]
        [(2, 10), (2, 10)]
    """
    exits = spec.get("exits") or []
    if not exits:
        raise ExitError("the FlexDNN spec has no exits (the plan kept none). HINT: use the backbone alone")
    missing = [k for k in ("num_classes", "input_shape") if k not in spec]
    missing += sorted({f"exits[].{k}" for e in exits for k in ("location", "filters", "widths", "in_hw") if k not in e})
    if missing:
        raise ExitError(f"the FlexDNN spec lacks {', '.join(missing)}. HINT: pass the spec flexdnn() returned "
                        f"(FlexDNNResult.spec) or the {SPEC_FILE} FlexDNNExits wrote")
    heads = [
        FilterSubsetExit(e["filters"], CompactHead(len(e["filters"]), e["widths"], spec["num_classes"],
                                                   tuple(e["in_hw"]), e.get("stem_pool", 1)))  # older specs: none
        for e in exits
    ]
    return MultiExitNetwork(_plain(backbone), positions=[e["location"] for e in exits], head=_Prebuilt(heads),
                            input_shape=tuple(spec["input_shape"])).eval()


def load_flex_network(backbone: nn.Module, dirpath: str | os.PathLike) -> MultiExitNetwork:
    """The planned network, weights loaded, from the files :class:`~nestflex.exits.flexdnn.FlexDNNExits` wrote.

    Its outputs equal those of the callback's ``result.network``, exit for exit, whether the
    exits were planned on a plain network or on a grown one.

    Args:
        backbone: the network the exits were planned on (the LightningModule's ``model``), plain
            or grown (nested): it gives the architecture only. It is copied, never changed: the
            weights, backbone included, come from the file.
        dirpath: the callback's output directory (``spec.json`` and ``model.safetensors``).

    Returns:
        the :class:`~nestflex.exits.MultiExitNetwork` of the planned exits, in eval mode.

    Raises:
        ExitError: a missing file, a plan that kept no exit, or weights that do not fit the
            network built on ``backbone`` (exits planned on another one).

    Example::

        Trainer(callbacks=[FlexDNNExits(dirpath="runs/x/flexdnn")]).fit(module, datamodule=dm)
        # later, in another process
        net = load_flex_network(module.model, "runs/x/flexdnn")
        out = net.early_exit(x, spec["thresholds"], confidence=spec["confidence"], fallback=spec["fallback"])
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from nestflex._io import read_json

    root = Path(dirpath)
    if not (root / SPEC_FILE).is_file():
        raise ExitError(f"`dirpath`={str(root)!r} has no {SPEC_FILE}. HINT: pass FlexDNNExits' output directory "
                        f"(default <trainer.default_root_dir>/flexdnn) after its run finished")
    spec = read_json(root / SPEC_FILE)
    if not spec.get("exits"):
        raise ExitError(f"`dirpath`={str(root)!r}: the FlexDNN plan kept no exit, so there is no network to load. "
                        f"HINT: the backbone alone is the cheapest network; use it")
    if not (root / WEIGHTS_FILE).is_file():
        raise ExitError(f"`dirpath`={str(root)!r} has {SPEC_FILE} but no {WEIGHTS_FILE}. HINT: the run that wrote "
                        f"them was interrupted; rerun FlexDNNExits")
    net = build_flex_network(_plain_copy(backbone), spec)
    try:
        net.load_state_dict(load_file(root / WEIGHTS_FILE))
    except (RuntimeError, OSError, SafetensorError) as e:
        detail = " ".join(str(e).split())[:400].rstrip(". ")  # torch's message spans lines
        raise ExitError(f"`dirpath`={str(root)!r}: {WEIGHTS_FILE} does not fit the network built on `backbone` "
                        f"({type(backbone).__name__}): {detail}. HINT: pass the network the exits were planned "
                        f"on (same architecture and widths)") from None
    return net.eval()
