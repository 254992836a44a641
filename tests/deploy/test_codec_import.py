"""The codec runs without torch (issue 37): it imports none, at module level or in any function."""

import ast
import subprocess
import sys
from pathlib import Path


import nestflex.deploy.codec as codec_pkg

CODEC_DIR = Path(codec_pkg.__file__).parent

# In a fresh interpreter where `import torch` fails: load the codec package without running
# nestflex.deploy's own __init__ (the rest of the runtime is not under test here), then use every
# public entry point on numpy arrays.
_WITHOUT_TORCH = f"""
import sys, types
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, NoTorch())
import nestflex
deploy = types.ModuleType("nestflex.deploy")
deploy.__path__ = [{str(CODEC_DIR.parent)!r}]
sys.modules["nestflex.deploy"] = deploy
import numpy as np
from nestflex.deploy import codec as c
x = np.maximum(np.random.default_rng(0).standard_normal((2, 3, 8)), 0).astype(np.float32)
for name in c.list_codecs():
    for bits in (None, 3, 12):
        frame = c.encode([x, x[:, :1].astype(np.float64)], bits, name)
        ys = c.decode(frame)
        assert all(type(y) is np.ndarray for y in ys) and c.inspect_frame(frame)[0].dtype == "float32"
qt = c.isquant(x, 4)
assert type(c.dequantize(qt)) is np.ndarray and type(c.fake_quantize(x, 2)) is np.ndarray
assert c.dequantize(c.fixed_quantize(x, 4, 0.0, 1.0)).shape == x.shape
assert c.unpack_codes(c.pack_codes(qt.q, 4), x.size, 4).shape == (x.size,)
assert c.measure_codec(x, 4, repeats=1).ratio > 1
assert "torch" not in sys.modules
print("ok")
"""


def test_codec_runs_with_torch_blocked():
    out = subprocess.run([sys.executable, "-c", _WITHOUT_TORCH], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_codec_sources_never_import_torch():
    # also catches an import in a function body or a branch the run above did not take
    for path in sorted(CODEC_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path.name}:{node.lineno}"


# Who imports torch first when `nestflex.deploy.codec` is imported the ordinary way (parent
# package included): prints the nestflex module on the stack at that moment, if any.
_SPY = """
import sys, traceback
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "torch" not in sys.modules:
            mods = [f.filename for f in traceback.extract_stack() if "nestflex" in f.filename]
            print("importer:", mods[-1] if mods else "?")
        return None
sys.meta_path.insert(0, Spy())
import nestflex.deploy.codec
print("torch:", "torch" in sys.modules)
"""


def test_importing_the_codec_imports_no_torch():
    # The check of issue 37 as written: `import nestflex.deploy.codec; assert "torch" not in
    # sys.modules` (it runs nestflex.deploy's __init__ too); on failure, name the importer.
    out = subprocess.run([sys.executable, "-c", _SPY], capture_output=True, text=True, check=True).stdout
    importer = next((line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("importer:")), "?")
    assert "torch: False" in out, f"importing the codec imported torch, by {importer}"
