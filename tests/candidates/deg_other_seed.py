"""Degenerate: a real softmax kernel, run on the inputs the reference would draw under
torch.manual_seed(0) instead of on x: a true softmax output, of the wrong inputs. Grading
seeds are secret and salted per evaluation, so this never matches."""
import torch
import triton
import triton.language as tl


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
    def __init__(self):
        super().__init__()
        self.answers = {}

    def forward(self, x):
        rows, cols = x.shape
        if (rows, cols) not in self.answers:
            torch.manual_seed(0)  # what problems/softmax/reference.py get_inputs would draw
            with torch.device(x.device):
                scale = torch.empty(rows, 1).uniform_(0.5, 8.0)
                x0 = torch.randn(rows, cols) * scale
            self.answers[(rows, cols)] = softmax(x0)
        return self.answers[(rows, cols)].clone()
