"""Split inference, device side (SPINN, DynO): the split runtime (:mod:`.runtime`), what each split
costs (:mod:`.costs`), the wire format (:mod:`.wire`), the gRPC client (:mod:`.client`), the
offloader that streams frames through a tail server (:mod:`.offload`), and the network profiler
(:mod:`.network`). gRPC is imported only when a :class:`TailClient` is made. The server is
:mod:`nestflex.serve`.
"""

from nestflex.deploy.split.client import SplitError, TailClient
from nestflex.deploy.split.costs import accuracy_drops, measure_bytes, measure_costs
from nestflex.deploy.split.network import NetworkProfiler
from nestflex.deploy.split.offload import Offloader, SplitAnswer, SplitConfig
from nestflex.deploy.split.runtime import SERVER_ONLY, HeadResult, SplitRuntime, TailResult

__all__ = ["SERVER_ONLY", "HeadResult", "TailResult", "SplitRuntime", "measure_costs", "measure_bytes",
           "accuracy_drops", "TailClient", "SplitError", "Offloader", "SplitConfig", "SplitAnswer", "NetworkProfiler"]
