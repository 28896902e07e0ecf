"""An episode on KernelBench/softmax-v0: four candidates an agent might submit, their info
and rewards. Runs anywhere: CPU mode (Triton's interpreter) when no GPU is visible.

    python examples/cpu_episode.py [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import kb_env

SYNTAX_ERROR = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x)          # missing colon
        return x
"""

# Writes zeros: with 16384 columns nearly every softmax output is below 1e-4, so a plain
# atol=1e-4 check would pass this. kb_env's tolerance adds a relative-L2 bar that rejects it.
ZEROS = """
import torch, triton, triton.language as tl

@triton.jit
def _zeros(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], tl.float32), mask=offs < n)

class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _zeros[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
        return out
"""

# Correct values, but torch does the work: the dispatcher sees aten::_softmax, which this
# problem forbids, so it is flagged and earns no more than a wrong answer.
TORCH_CALL = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args()

    known_good = kb_env.get_problem("softmax").solution_paths[0].read_text()
    env = gym.make("KernelBench/softmax-v0", device=args.device, max_turns=4)
    obs, info = env.reset(seed=0)
    print(f"problem: {info['problem']}  mode: {info['mode']}  shapes: {info['shapes']}")
    print(f"reference:\n{obs['reference']}")

    rows = []
    for label, source in [("syntax error", SYNTAX_ERROR), ("all zeros", ZEROS),
                          ("torch.softmax", TORCH_CALL), ("known-good Triton", known_good)]:
        obs, reward, terminated, truncated, info = env.step(source)
        rows.append((obs["turn"], label, info["compiled"], info["correct"], info["error"], info["flags"], reward))
        print(f"\n--- turn {obs['turn']}: {label} -> feedback the agent reads ---\n{obs['feedback']}")
    env.close()

    print("\n| turn | candidate | compiled | correct | error | flags | reward |")
    print("|---|---|---|---|---|---|---|")
    for turn, label, compiled, correct, error, flags, reward in rows:
        print(f"| {turn} | {label} | {compiled} | {correct} | {error} | {', '.join(flags) or '-'} | {reward:.3f} |")
    print(f"episode truncated after {turn} turns: {truncated}")


if __name__ == "__main__":
    main()
