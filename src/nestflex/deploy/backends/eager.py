"""The torch eager backends, optional (torch is imported only when one prepares something): the
bundle's op program interpreted in torch (:mod:`.torch_program`), in NCHW (``eager``) or with every
4-D weight and the input in channels-last memory order (``channels_last``: Cappuccino's map-major
layout, oneDNN's NHWC kernels). The reference for parity and debugging; numpy in, numpy out like
every backend (the tensors are views of the runtime's numpy arrays, nothing is copied).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from nestflex.deploy.backends.base import Backend, ExitsContext, LevelContext, Prepared, PreparedExits
from nestflex.deploy.bundle.program import cut_program

__all__ = ["EagerBackend", "ChannelsLastBackend"]


def _torch_tensors(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v) for k, v in arrays.items()}


def _program(nodes: Sequence[Any], inputs: Sequence[str], outputs: Sequence[str], tensors: Callable[[], Any], level: int,
             threads: int, convert: Callable[[Any], Any] = lambda t: t) -> Callable[..., Any]:
    """``fn(*numpy arrays) -> tuple of numpy arrays`` (the program's output when ``outputs`` is empty),
    on ``threads`` torch intra-op threads. Torch's setting is process-wide, so each call sets it and
    puts the caller's back (a few microseconds): a plan's thread count never leaks into the training
    code around it."""
    import torch

    from nestflex.deploy.backends.torch_program import run_program

    def run(*values: np.ndarray) -> tuple[np.ndarray, ...]:
        before = torch.get_num_threads()
        if before != threads:
            torch.set_num_threads(threads)
        try:
            with torch.no_grad():
                env = {name: convert(torch.from_numpy(np.ascontiguousarray(v))) for name, v in zip(inputs, values)}
                result = run_program(nodes, env, tensors(), level)
                got = tuple(env[o] for o in outputs) if outputs else (result,)
                return tuple(t.contiguous().numpy() for t in got)
        finally:
            if before != threads:
                torch.set_num_threads(before)

    return run


class EagerBackend(Backend):
    """The op program in torch eager, NCHW."""

    name = "eager"
    package = "torch"

    def prepare(self, ctx: LevelContext) -> Prepared:
        nodes = ctx.bundle.spec.capacity.program.nodes
        run = _program(nodes, [nodes[0].name], [], lambda: _torch_tensors(ctx.tensors()), ctx.level, ctx.threads)
        return Prepared(lambda x: run(x)[0])

    def prepare_exits(self, ctx: ExitsContext) -> PreparedExits:
        backbone = lambda: _torch_tensors(ctx.backbone_tensors())  # noqa: E731
        heads_t = lambda: _torch_tensors(ctx.head_tensors())  # noqa: E731
        stages = [_program(body, ins, outs, backbone, ctx.level, ctx.threads)
                  for ins, body, outs in cut_program(ctx.backbone, ctx.spec.taps)]
        heads = []
        for h in ctx.spec.heads:
            nodes = h.program.nodes
            run = _program(nodes, [nodes[0].name], [], heads_t, 0, ctx.threads)
            heads.append(lambda state, run=run: run(state[0])[0])
        return PreparedExits(stages, heads + [lambda state: state[0]])


class ChannelsLastBackend(Backend):
    """The op program in torch eager with the input and every 4-D weight in channels-last order (a
    channels-last copy of the level's weights is made once per switch)."""

    name = "channels_last"
    package = "torch"

    def prepare(self, ctx: LevelContext) -> Prepared:
        import torch

        nodes = ctx.bundle.spec.capacity.program.nodes
        tensors = {k: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                   for k, t in _torch_tensors(ctx.tensors()).items()}
        held = sum(t.numel() * t.element_size() for t in tensors.values() if t.dim() == 4)
        run = _program(nodes, [nodes[0].name], [], lambda: tensors, ctx.level, ctx.threads,
                       lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t)
        return Prepared(lambda x: run(x)[0], held)
