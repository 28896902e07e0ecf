import os

import torch
import torch.nn as nn

os._exit(3)  # takes its whole process down when imported


class Model(nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
