"""One import point for every nestflex Lightning callback.

    from nestflex.callbacks import FilterPruning
    trainer = Trainer(callbacks=[FilterPruning(...)])

Each callback lives next to the algorithm it drives (``nestflex.pruning``, ``nestflex.exits``,
...); this module only re-exports them, so user code and LightningCLI YAML snippets in
``callbacks/`` have one stable path (``class_path: nestflex.callbacks.<Name>``).
"""

from __future__ import annotations

from nestflex.capacity.callback import FreezeAndGrow
from nestflex.exits.callback import OverthinkingSchedule
from nestflex.exits.flexdnn.callback import FlexDNNExits
from nestflex.export.callback import BundleExporter
from nestflex.pruning import FilterPruning

__all__: list[str] = ["BundleExporter", "FilterPruning", "FlexDNNExits", "FreezeAndGrow", "OverthinkingSchedule"]
