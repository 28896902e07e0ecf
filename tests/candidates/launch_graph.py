"""Launch cap (GPU, run with max_launches: 1): captures four kernel launches (a quarter of the
rows each) into a CUDA graph per input address and replays it, so the host sees one graph
launch (plus one clone) per call. Graph replays are counted kernel by kernel:
too_many_launches."""
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


def _launch_quarters(x, out):
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    bounds = [rows * i // 4 for i in range(5)]
    for lo, hi in zip(bounds, bounds[1:]):
        _softmax_rows[(hi - lo,)](x[lo:], out[lo:], cols, BLOCK=block, num_warps=4 if block <= 2048 else 16)


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.graphs = {}

    def forward(self, x):
        x = x.contiguous()
        key = (x.data_ptr(), tuple(x.shape))
        if key not in self.graphs:
            out = torch.empty_like(x)
            _launch_quarters(x, out)  # compiles the kernel before capture
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                graph.capture_begin()
                _launch_quarters(x, out)
                graph.capture_end()
            torch.cuda.current_stream().wait_stream(side)
            if len(self.graphs) >= 8:
                self.graphs.pop(next(iter(self.graphs)))
            self.graphs[key] = (graph, out)
        graph, out = self.graphs[key]
        graph.replay()
        return out.clone()
