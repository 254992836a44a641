"""torch.fx tracing with a fallback for modules fx cannot trace.

Standard layers (conv, linear, norms, activations, pools) are kept as leaves so the graph talks
in module names. When fx fails inside a submodule (data-dependent control flow, unsupported
Python), the smallest failing submodules become opaque leaves: the rest of the model is still
analysed, and the channels that touch an opaque module are locked (never pruned).
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from nestflex.errors import GraphError

__all__ = ["LEAF_TYPES", "LEAF_NAMES", "trace_module", "flop_counter"]

#: Module types always kept whole (never traced into). ``_BatchNorm`` covers timm's
#: ``BatchNormAct2d``, whose forward would otherwise be traced into functional calls.
LEAF_TYPES: tuple[type[nn.Module], ...] = (
    nn.Conv1d,
    nn.Conv2d,
    nn.Linear,
    _BatchNorm,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.GELU,
    nn.SiLU,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Sigmoid,
    nn.Tanh,
    nn.Identity,
    nn.Dropout,
    nn.Dropout2d,
    nn.MaxPool2d,
    nn.AvgPool2d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d,
    nn.Flatten,
)


#: Module classes of other libraries kept whole, by class name (the library need not be imported):
#: timm's ConvNeXt-V2 ``GlobalResponseNorm``, so the channel analysis sees one norm with a
#: ``weight``/``bias`` per channel (``nestflex.graph.groups.CHANNEL_STATISTIC_NORMS``) rather than its
#: reductions and views one by one.
LEAF_NAMES: frozenset[str] = frozenset({"GlobalResponseNorm"})


class _Tracer(fx.Tracer):
    def __init__(self, opaque: frozenset[str]) -> None:
        super().__init__()
        self.opaque = opaque

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if module_qualified_name in self.opaque or isinstance(m, LEAF_TYPES) or type(m).__name__ in LEAF_NAMES:
            return True
        return super().is_leaf_module(m, module_qualified_name)


def _try_trace(root: nn.Module, opaque: frozenset[str]) -> fx.GraphModule | Exception:
    with _untouched(root):
        try:
            graph = _Tracer(opaque).trace(root)
            # built before the model is restored: fx keeps a forward's tensor constants
            # (`_tensor_constant0`, Swin's and MaxViT's) as attributes of the root, which the
            # graph module copies
            return fx.GraphModule(root, graph, class_name=type(root).__name__)
        except Exception as e:  # fx raises many types (TraceError, TypeError, NotImplementedError...)
            return e


#: attributes every nn.Module has (parameters, buffers, children, hooks, the training flag):
#: tracing does not change them, and they are not the module's own state
_MODULE_INTERNALS = frozenset(nn.Module().__dict__)


@contextmanager
def _untouched(root: nn.Module) -> Iterator[None]:
    """Leave no trace of a trace in the model: every submodule's own attributes come back as
    they were, and attributes the forward added are removed.

    fx runs the forward on proxies, and a forward that caches (timm's LeViT and EfficientFormer
    keep ``attention_bias_cache`` in eval mode) stores proxies in the model: the next trace,
    and the callbacks trace often, then fails on a value from a finished graph. Containers
    (dict, list, set) keep their identity and get their contents back.
    """
    saved = []
    for module in root.modules():
        own = {k: (v, copy.copy(v) if isinstance(v, (dict, list, set)) else None)
               for k, v in module.__dict__.items() if k not in _MODULE_INTERNALS}
        saved.append((module, own))
    try:
        yield
    finally:
        for module, own in saved:
            attrs = module.__dict__
            for k in [k for k in attrs if k not in own and k not in _MODULE_INTERNALS]:
                del attrs[k]
            for k, (value, contents) in own.items():
                if isinstance(value, dict):
                    value.clear()
                    value.update(contents)
                elif isinstance(value, list):
                    value[:] = contents
                elif isinstance(value, set):
                    value.clear()
                    value.update(contents)
                attrs[k] = value


def trace_module(model: nn.Module, strict: bool = False) -> tuple[fx.GraphModule, dict[str, str]]:
    """Trace ``model`` into a GraphModule that shares ``model``'s submodules.

    Args:
        model: the module to trace.
        strict: raise instead of falling back to opaque leaves.

    Returns:
        ``(graph_module, opaque)`` where ``opaque`` maps each module kept as an opaque leaf to
        the reason fx gave.

    Raises:
        GraphError: the model's own forward cannot be traced, or (``strict``) any submodule
            cannot; the message names the module and fx's reason.
    """
    opaque: dict[str, str] = {}
    for _ in range(64):  # each round makes at least one more module opaque
        result = _try_trace(model, frozenset(opaque))
        if isinstance(result, fx.GraphModule):
            if opaque:
                names = ", ".join(f"`{n}` ({type(model.get_submodule(n)).__name__})" for n in opaque)
                warnings.warn(
                    f"torch.fx cannot trace {names}; kept as opaque leaves: channels that enter or "
                    f"leave them are locked (not prunable, not split inside).",
                    stacklevel=3,
                )
            return result, opaque
        failing = _smallest_failing(model, frozenset(opaque))
        if not failing:
            raise GraphError(
                f"torch.fx cannot trace the forward of `{type(model).__name__}` itself: "
                f"{type(result).__name__}: {result}. HINT: move data-dependent control flow into "
                f"a submodule (it then becomes an opaque leaf) or make it static."
            )
        if strict:
            name, reason = next(iter(failing.items()))
            raise GraphError(
                f"torch.fx cannot trace module `{name}` ({type(model.get_submodule(name)).__name__}): "
                f"{reason}. HINT: pass strict=False to keep it as an opaque leaf."
            )
        opaque.update(failing)
    raise GraphError(f"tracing `{type(model).__name__}` did not converge")  # pragma: no cover


def _smallest_failing(model: nn.Module, opaque: frozenset[str]) -> dict[str, str]:
    """Submodules that fail to trace on their own while none of their children do."""
    failing: dict[str, str] = {}
    tracer = _Tracer(opaque)
    for name, module in model.named_modules():
        if not name or tracer.is_leaf_module(module, name) or any(name.startswith(o + ".") for o in opaque):
            continue
        result = _try_trace(module, frozenset())
        if isinstance(result, Exception):
            failing[name] = f"{type(result).__name__}: {result}"
    # keep the deepest ones: a parent fails whenever its child does
    return {n: r for n, r in failing.items() if not any(o.startswith(n + ".") for o in failing)}


@torch.no_grad()
def propagate_shapes(gm: fx.GraphModule, example: torch.Tensor) -> None:
    """Run ``example`` through ``gm`` in eval mode and store what each node computes in ``node.meta``.

    ``node.meta["shape"]`` is the output's shape (``None`` for non-tensors) and
    ``node.meta["macs"]`` the multiply-accumulates the node ran, as ``torch.utils.flop_counter``
    counts them (FLOPs / 2 of convolutions, matrix products and attention), whatever the node is:
    a functional ``F.linear``, an ``nn.MultiheadAttention``, a window attention that folds windows
    into the batch dim, an opaque module. Training flags are restored so tracing never changes
    BatchNorm statistics.
    """
    modes = {m: m.training for m in gm.modules()}
    # nn.MultiheadAttention's inference fast path is one fused op the counter does not see
    fastpath = torch.backends.mha.get_fastpath_enabled()
    gm.eval()
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with flop_counter(gm) as counter:
            _Recorder(gm, counter).run(example)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for m, mode in modes.items():
            m.training = mode


@contextmanager
def flop_counter(module: nn.Module | None = None) -> Iterator[Any]:
    """``torch.utils.flop_counter.FlopCounterMode`` (no display) that also counts the CPU kernel of
    ``scaled_dot_product_attention``: torch registers its formula for the CUDA kernels only, so
    fused attention on a CPU counted 0. The CPU kernel gets torch's own ``sdpa_flop_count``.

    Args:
        module: the model about to run under the counter, or ``None``. Its parameters that
            require grad stop requiring it while counting and are restored on exit: the
            counter's module tracker hooks the gradients of module inputs, and fails on a
            parameter passed into a submodule under ``no_grad`` (timm's PiT hands its class token
            to its pooling layers).

    Yields:
        the active ``FlopCounterMode``; ``get_total_flops()`` gives the FLOPs counted so far
        (2 per multiply-accumulate).

    Examples:
        >>> import torch
        >>> layer = torch.nn.Linear(4, 2)
        >>> with flop_counter(layer) as counter:
        ...     _ = layer(torch.zeros(3, 4))
        >>> counter.get_total_flops(), layer.weight.requires_grad
        (48, True)
    """
    from torch.utils import flop_counter as fc

    mapping = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None and hasattr(fc, "sdpa_flop_count"):
        def cpu_sdpa(query, key, value, *args, out_shape=None, **kwargs):
            return fc.sdpa_flop_count(query, key, value)

        mapping[op] = cpu_sdpa
    params = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    try:
        for p in params:
            p.requires_grad_(False)
        with fc.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            yield counter
    finally:
        for p in params:
            p.requires_grad_(True)


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, counter) -> None:
        super().__init__(gm)
        self.counter = counter

    def run_node(self, n: fx.Node):
        before = self.counter.get_total_flops()
        try:
            out = super().run_node(n)
        except Exception as e:
            e.nestflex_node = n  # trace() names the op and the layer that failed
            raise
        n.meta["shape"] = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        n.meta["macs"] = (self.counter.get_total_flops() - before) // 2
        return out
