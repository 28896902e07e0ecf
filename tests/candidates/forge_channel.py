"""Writes garbage, then a forged 'success' frame, straight into the harness's result pipe
(its file descriptor is in the worker's argv)."""
import json
import os
import struct
import sys

import torch

fd = int(sys.argv[2])
os.write(fd, b"\xff" * 8 + b"not a frame")
body = json.dumps({"_body": {"ok": True, "correct": True, "speedup": 100.0}, "_buffers": []}).encode()
os.write(fd, struct.pack("<Q", len(body)) + body)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
