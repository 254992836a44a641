import subprocess
import sys

# grpc and ray: the split client imports gRPC only when a TailClient is made; Ray belongs to nestflex.serve.ray
HEAVY = ("lightning", "pytorch_lightning", "timm", "torchmetrics", "onnx", "grpc", "ray")


def test_importing_deploy_pulls_in_no_training_dependency():
    # a fresh interpreter: this test process has Lightning loaded already
    code = (
        "import sys, nestflex.deploy\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"nestflex.deploy imported {out.stdout.strip()}"
