"""The light runtime: loads nestflex bundles and runs them under schedulers.

Invariant (DESIGN.md 6): importing this package pulls in no training dependency (Lightning,
timm, torchmetrics, onnx). The bundle loader, codec and schedulers land here in later releases;
today it holds only what the rest of the package already shares with it.
"""

from nestflex.errors import NestflexError

__all__ = ["NestflexError"]
