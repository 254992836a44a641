"""nestflex: adaptive on-device deep learning as PyTorch Lightning plugins.

The top-level package stays light on purpose: it must not import Lightning, timm or
torchmetrics, because ``nestflex.deploy`` (the runtime) is imported through it.
"""

from nestflex.errors import DataError, GraphError, ModelError, NestflexError, ProfileError

__version__ = "0.1.0"

__all__ = ["__version__", "NestflexError", "DataError", "ModelError", "GraphError", "ProfileError"]
