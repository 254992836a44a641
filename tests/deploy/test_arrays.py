import numpy as np
import pytest
import torch

from nestflex.deploy._arrays import as_numpy, is_torch, like, to_numpy


def test_numpy_in_numpy_out_torch_in_torch_out():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert isinstance(like(a, a * 2), np.ndarray)
    t = torch.arange(6.0).reshape(2, 3)
    view, back = as_numpy(t)
    assert is_torch(t) and not is_torch(view)
    assert np.shares_memory(view, t.numpy())  # a CPU tensor is not copied
    out = back((view.sum(0), view[::-1]))  # a tuple, and a negative-stride view
    assert isinstance(out, tuple) and all(isinstance(o, torch.Tensor) for o in out)
    assert out[1].tolist() == [[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]
    assert like(t, np.asarray(np.float32(2.0))).shape == ()  # a 0-d array stays 0-d


def test_a_grad_requiring_or_bfloat16_tensor_reads_as_numpy():
    t = torch.ones(3, requires_grad=True)
    assert to_numpy(t).tolist() == [1.0, 1.0, 1.0]
    got = to_numpy(torch.tensor([0.5, 1.5], dtype=torch.bfloat16))  # numpy has no bfloat16
    assert got.dtype == np.float32 and got.tolist() == [0.5, 1.5]


def test_like_gives_back_tensors_on_the_device_of_the_tensor_that_came_in():
    x = torch.empty(2, device="meta")  # any non-CPU device; "meta" exists on every machine
    out = like(x, (np.ones(2), np.zeros(2, dtype=np.int64)))
    assert [o.device.type for o in out] == ["meta", "meta"] and out[1].dtype == torch.int64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_like_gives_back_cuda_tensors_for_cuda_tensors():
    x = torch.arange(4.0, device="cuda")
    back = like(x, to_numpy(x) * 2)
    assert back.device == x.device and back.tolist() == [0.0, 2.0, 4.0, 6.0]
