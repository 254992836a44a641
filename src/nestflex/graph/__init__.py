"""Structure graph: tracing, coupled channel groups, MACs/params, split points, surgery."""

from nestflex.graph.groups import ChannelGroup, Member
from nestflex.graph.split import split_model
from nestflex.graph.structure import Layer, SplitPoint, StructureGraph, trace
from nestflex.graph.surgery import permute_channels, prune_channels, prune_groups, resize_like, select_channels, slice_channels

__all__ = [
    "trace",
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
]
