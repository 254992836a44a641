"""Structure graph: tracing, coupled channel groups, MACs/params, split points, surgery."""

from nestflex.graph._tracer import flop_counter
from nestflex.graph.groups import ChannelGroup, Member
from nestflex.graph.split import split_model
from nestflex.graph.structure import (
    DEFAULT_INPUT_SHAPE,
    Layer,
    SplitPoint,
    StructureGraph,
    check_input_shape,
    checked_batches,
    input_shape_of,
    trace,
)
from nestflex.graph.surgery import permute_channels, prune_channels, prune_groups, resize_like, select_channels, slice_channels

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
    "SplitPoint",
    "select_channels",
    "prune_channels",
    "permute_channels",
    "slice_channels",
    "prune_groups",
    "resize_like",
    "split_model",
    "flop_counter",
]
