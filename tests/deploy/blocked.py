"""Run code in a fresh interpreter that behaves as the base install (numpy + onnxruntime): torch,
the training packages and onnx are absent, and every attempt to import one is recorded.

How "absent" is made, so that the code under test sees exactly what a machine without them shows:

* each blocked package is ``None`` in ``sys.modules``: ``import torch`` raises ModuleNotFoundError
  and ``importlib.util.find_spec("torch")`` is ``None`` (what a backend's ``available()`` asks);
* ``builtins.__import__`` records every import statement that names one (``ATTEMPTS``), so a test
  can tell "never tried" from "tried and fell back";
* a ``sys.meta_path`` finder put first records and refuses any that gets past both (a module that
  removed the ``None`` entry);
* ``loaded(roots)`` lists the modules of ``roots`` really imported.

The test process itself has torch loaded, which is why this runs in a subprocess.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

__all__ = ["BLOCKED", "BLOCKER", "run_blocked"]

#: what the base install does not have: torch, the training packages, onnx (nestflex[tune])
BLOCKED = ("torch", "lightning", "pytorch_lightning", "timm", "torchmetrics", "onnx")

BLOCKER = textwrap.dedent(f"""
    import builtins, sys
    BLOCKED = {BLOCKED!r}
    ATTEMPTS = []

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                ATTEMPTS.append(name)
                raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    for _m in BLOCKED:
        sys.modules[_m] = None
    _import = builtins.__import__

    def _recording_import(name, *args, **kwargs):
        if name.split(".")[0] in BLOCKED:
            ATTEMPTS.append(name)
        return _import(name, *args, **kwargs)

    builtins.__import__ = _recording_import

    def loaded(roots=BLOCKED):  # the modules of roots really imported (a blocked one's None entry is not)
        return sorted(m for m, v in list(sys.modules.items()) if v is not None and m.split(".")[0] in roots)
""")


def run_blocked(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``code`` (dedented) after :data:`BLOCKER` in a fresh interpreter; stdout and stderr captured."""
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True,
                          check=False, timeout=timeout)
