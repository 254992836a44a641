"""NestDNN freeze-&-grow: multi-capacity models whose levels are nested and share weights.

``levels`` picks K footprints of a pruning roadmap and their nested channel order; ``nested``
holds the layers (weights stored once, level ``k`` reads a width prefix, switchable BatchNorm)
and ``set_level``; ``freeze`` keeps smaller levels bit-identical while a larger one trains;
``callback`` is the Lightning callback; ``profile`` reports per-level profiles, memory and the
page-in/page-out cost of switching levels. docs/capacity.md is the user guide.
"""

from nestflex.capacity.callback import FreezeAndGrow, level_of_epoch
from nestflex.capacity.freeze import LevelFreezer, trainable_masks
from nestflex.capacity.levels import LevelPlan, choose_levels, footprint_costs, plan_levels
from nestflex.capacity.model import INITS, MultiCapacityModel, check_roadmap, nest_from_roadmap, read_state
from nestflex.capacity.nested import (
    NestedConv2d,
    NestedLinear,
    NestedNorm,
    Source,
    extract_level,
    get_level,
    is_nested,
    level_regions,
    nest_,
    num_levels,
    set_level,
)
from nestflex.errors import CapacityError

__all__ = [
    "CapacityError",
    "FreezeAndGrow",
    "level_of_epoch",
    "LevelFreezer",
    "trainable_masks",
    "LevelPlan",
    "choose_levels",
    "footprint_costs",
    "plan_levels",
    "INITS",
    "MultiCapacityModel",
    "check_roadmap",
    "nest_from_roadmap",
    "read_state",
    "NestedConv2d",
    "NestedLinear",
    "NestedNorm",
    "Source",
    "extract_level",
    "get_level",
    "is_nested",
    "level_regions",
    "nest_",
    "num_levels",
    "set_level",
]
