"""Coupled channel groups: which tensor dimensions must shrink, grow or move together.

Every node's output channel dimension (dim 1) belongs to a *channel space*. A conv or linear
creates a new space; BatchNorm, activations, pools, dropout and identity keep it; an elementwise
add/mul of two tensors ties their spaces together (residual connections); a depthwise conv keeps
its input's space; a flatten of ``(C, H, W)`` maps channel ``c`` to the ``H*W`` features
``c*H*W ... c*H*W + H*W - 1`` of the next linear. Spaces tied together form one
:class:`ChannelGroup` whose members are the parameter/buffer slices to edit.

A concatenation along the channels makes a *composite* tensor: its channels are the inputs'
channels one part after the other. A consumer of it (a conv's input, a norm, a depthwise conv, a
linear after a flatten) holds one member per part, each with a :class:`Layout` saying which parts
come before it; the offsets are read from the parts' current widths at surgery time, so pruning
one part moves the others' rows (Torch-Pruning's index mapping, DenseNet's and Inception's
blocks). A slice ``x[:, :b]`` that keeps every channel stays the identity as they are pruned; one
that keeps whole parts locks them (its bounds are constants) and leaves the later parts free.

A grouped (non-depthwise) conv with ``G`` groups reads its input in ``G`` blocks and writes its
output in ``G`` blocks; a group keeps the same number of channels in every block. Its input and
output spaces are *interleaved*: a group's channel ``j`` stands for channel ``j`` of every block
(``G`` physical channels, :attr:`Member.copies`), and the conv's weight is indexed on dim 1 by
the position inside a block. Pruning channel ``j`` removes it from every block, so the conv keeps
its ``G`` groups with narrower blocks (Torch-Pruning prunes grouped convs the same way:
``ch_groups``). ResNeXt and RegNet blocks prune this way.

Channels need not be dim 1. Each tensor's channel dim is followed through ``permute``,
``transpose`` and reshapes that keep it whole (the last dim of a token tensor ``(N, T, C)`` or of
a channels-last map ``(N, H, W, C)``, windows folded into the batch included), so a ``Linear`` on
the last dim consumes and produces channels like a 1x1 conv: a transformer's MLP hidden
channels (``fc1`` -> GELU -> ``fc2``) form a group. ``LayerNorm`` and ``GroupNorm`` normalise over
the channels (removing one changes every other's statistics), so they lock theirs, as do
ConvNeXt-V2's GRN (each channel divided by a mean over the channels) and the inputs of a
weight-standardised conv (each output's weight row standardised over its inputs; its outputs
prune exactly, its per-output ``gain`` with them). With ``approximate=True`` these groups prune
anyway (Torch-Pruning's behaviour): the norms' ``weight``/``bias`` are members, the statistics
change, and :attr:`ChannelGroup.approximation` says which layers do so. A LayerNorm over more than
the channels, or a GroupNorm of several groups, stays locked.

A parameter or buffer the forward reads (a class token, a position embedding, a layer scale
``gamma``, a ``(C, 1, 1)`` gain) joins the channels it is combined with elementwise, its matching
dim a member (role ``param``), so it is sliced with them.

``torch.stack`` of tensors that carry the same channels ties them (like an add) and moves the
channel dim right; ``sum``/``mean`` over other dims move it back. A layer whose output is read
as ``k`` blocks (``fc(x).view(B, k, C // k, H, W)``, a selective kernel's per-path attention)
holds channel ``j`` in row ``j`` of every block (:attr:`Member.copies` ``k``), so timm's
``SelectiveKernel`` prunes its paths with the attention that weighs them.

Attention heads are a unit. ``self.qkv(x).reshape(B, N, 3, H, d)`` splits a Linear's output
into blocks (q, k, v) of ``H`` heads of ``d`` dims; the heads are followed through the permute,
``unbind``/indexing into q, k and v, ``scaled_dot_product_attention`` or ``q @ k.T``, softmax,
``attn @ v``, and the reshape that merges them back into the last dim, into the Linear after
(``proj``). They form a group of width ``H``: a head is ``d`` consecutive rows of each block of
``qkv`` (:attr:`Member.copies` blocks, :attr:`Member.factor` ``d``) and ``d`` consecutive inputs
of ``proj``, and the module's ``num_heads`` (and ``attn_dim``) follow as *count* members. Whole
heads, not head dims, so the softmax scale (``d ** -0.5``, by default read off the tensors' size)
is unchanged and pruned equals masked exactly; Torch-Pruning's ``prune_num_heads``. This is
timm's ``Attention`` convention: the module has int ``num_heads`` and ``head_dim`` and a
``proj`` Linear; anything else (a per-head bias table, a mask, other names) locks the heads.

A space is *locked* (not prunable) when it touches something the analysis cannot see through:
the model input or output, an opaque module, a channel slice (its bounds are constants), a
composite tensor added to a plain one, a grouped conv fed by a concatenation or reaching one,
two grouped convs with different block counts on one space, or any op not listed below.
Locking is always the safe answer: a locked group is simply not pruned.

The package, by concern: :mod:`.records` (:class:`ChannelGroup`, :class:`Member`,
:class:`Layout`), :mod:`.finder` (:func:`find_groups`, the walk over the graph), and the
finder's rules: :mod:`._shapes` (a channel dim through shape ops), :mod:`._joins` (adds,
concatenations, slices, stacks) and :mod:`._attention` (heads); :mod:`._spaces` holds the
union-find over channel spaces.
"""

from nestflex.graph.groups.finder import CHANNEL_STATISTIC_NORMS, WEIGHT_STANDARDISING_CONVS, find_groups
from nestflex.graph.groups.records import ChannelGroup, Layout, Member

__all__ = ["Member", "Layout", "ChannelGroup", "find_groups", "WEIGHT_STANDARDISING_CONVS", "CHANNEL_STATISTIC_NORMS"]
