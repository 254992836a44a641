"""The server side of split inference (SPINN, DynO): the tail of a bundle behind gRPC or Ray Serve.

Deploy-side and optional: ``pip install "nestflex[serve]"`` (gRPC) or ``"nestflex[ray]"`` (Ray
Serve scale-out). It imports :mod:`nestflex.deploy` (bundle, split runtime, codec, wire format),
never the training side.

* :class:`TailServer` (:mod:`nestflex.serve.server`): ``nestflex serve BUNDLE --port N``.
* :mod:`nestflex.serve.ray`: the same tail as a Ray Serve deployment (replicas, autoscaling,
  ``@serve.batch``).
"""

from nestflex.serve.server import ServerHandle, TailServer

__all__ = ["TailServer", "ServerHandle"]
