"""L2 residency (GPU): through a load_inline extension, raises the device's persisting-L2
limit and sets an access-policy window over the input on the current stream before every
call, so the input survives the harness's L2 flush and the next read hits L2. A timing
harness must flag this (l2_persistence). The kernel itself is a real softmax."""
import torch
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline

_SRC = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <algorithm>

int64_t pin_in_l2(torch::Tensor x) {
  int device = x.get_device(), limit = 0, window = 0;
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxPersistingL2CacheSize, device);
  cudaDeviceGetAttribute(&window, cudaDevAttrMaxAccessPolicyWindowSize, device);
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, (size_t)limit);
  cudaStreamAttrValue attr = {};
  attr.accessPolicyWindow.base_ptr = x.data_ptr();
  attr.accessPolicyWindow.num_bytes = std::min<size_t>(x.nbytes(), (size_t)window);
  attr.accessPolicyWindow.hitRatio = 1.0f;
  attr.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  attr.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  return (int64_t)cudaStreamSetAttribute(c10::cuda::getCurrentCUDAStream().stream(),
                                         cudaStreamAttributeAccessPolicyWindow, &attr);
}
'''
_ext = load_inline("kb_l2_pin", cpp_sources=_SRC, functions=["pin_in_l2"], with_cuda=True)


@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * n_cols + cols, num / tl.sum(num, axis=0), mask=mask)


def softmax(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    block = triton.next_power_of_2(x.shape[1])
    _softmax_rows[(x.shape[0],)](x, out, x.shape[1], BLOCK=block, num_warps=4 if block <= 2048 else 16)
    return out


class ModelNew(torch.nn.Module):
    def forward(self, x):
        x = x.contiguous()
        _ext.pin_in_l2(x)
        return softmax(x)
