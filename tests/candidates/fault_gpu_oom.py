"""Fault (GPU): asks for a 64 TiB device buffer. torch raises OutOfMemoryError in the worker:
runtime_error, and the GPU stays usable for the next evaluation."""
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        scratch = torch.empty(1 << 46, dtype=torch.uint8, device=x.device)
        return scratch[: x.numel() * 4].view(torch.float32).view(x.shape)
