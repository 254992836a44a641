"""Structure graph: tracing, coupled channel groups, MACs/params, cut points, surgery.

Modules: :mod:`.structure` (``trace``, :class:`StructureGraph`, :class:`CutPoint`), :mod:`.groups`
(coupled channel groups, a subpackage by concern), :mod:`.surgery` (pruning, permuting, slicing
channels), :mod:`.cut` (a model cut in two at a cut point). ``SplitPoint`` and ``split_model`` are
the names of :class:`CutPoint` and :func:`cut_model` before issue 39.
"""

from nestflex.graph._tracer import flop_counter
from nestflex.graph.cut import cut_model, split_model
from nestflex.graph.groups import ChannelGroup, Member
from nestflex.graph.structure import (
    DEFAULT_INPUT_SHAPE,
    CutPoint,
    Layer,
    SplitPoint,
    StructureGraph,
    check_input_shape,
    checked_batches,
    input_shape_of,
    trace,
)
from nestflex.graph.surgery import (
    permute_channels,
    prune_channels,
    prune_groups,
    resize_like,
    select_channels,
    slice_channels,
)

__all__ = [
    "trace",
    "input_shape_of",
    "check_input_shape",
    "checked_batches",
    "DEFAULT_INPUT_SHAPE",
    "StructureGraph",
    "ChannelGroup",
    "Member",
    "Layer",
    "CutPoint",
    "SplitPoint",
    "select_channels",
    "prune_channels",
    "permute_channels",
    "slice_channels",
    "prune_groups",
    "resize_like",
    "cut_model",
    "split_model",
    "flop_counter",
]
