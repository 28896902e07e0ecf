"""What an LLM agent is told: the contract, the GPU, the forbidden shortcuts and the budget
(first turn), then each evaluation's feedback (later turns)."""

from __future__ import annotations

from ..problem import ProblemSpec

SYSTEM = {
    "triton": ("You are an expert GPU kernel engineer. You write Triton kernels (`import triton`, "
               "`import triton.language as tl`) that replace PyTorch reference code and run as close "
               "to the GPU's roofline as you can make them."),
    "cuda": ("You are an expert GPU kernel engineer. You write CUDA C++ kernels, compiled from Python with "
             "`torch.utils.cpp_extension.load_inline`, that replace PyTorch reference code and run as "
             "close to the GPU's roofline as you can make them."),
}

_CONTRACT = """\
Contract:
- Reply with one complete Python module in a single ```python code block; the last such block is what runs.
- It defines `class ModelNew(torch.nn.Module)` whose `__init__` takes the reference's init inputs and
  whose `forward` takes the same inputs as the reference and returns the same outputs (shape, dtype, device).
- It must load the reference model's `state_dict` strictly: keep the same parameter and buffer names.
- The main computation must run in your own kernels. Calling torch or vendor libraries for the work
  is detected by the dispatcher and the profiler and earns no more than a wrong answer; so do
  caching outputs, tampering with timers or global flags, and leaving work running after return.
- Correctness is checked on several seeds, on stress inputs and on every timed call's outputs."""


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:g} hour(s)" if seconds >= 3600 else f"{seconds / 60:g} minute(s)"


def first_prompt(spec: ProblemSpec, backend: str, gpu: str, max_turns: int, reference: str,
                 budget_s: float | None = None) -> str:
    """The opening user message for one problem (`budget_s`: the episode's wall-clock budget, if any)."""
    shapes = "; ".join(", ".join(f"{k}={v}" for k, v in s.items()) for s in spec.shapes.gpu)
    forbidden = spec.forbidden
    rules = []
    if forbidden.imports:
        rules.append("forbidden imports: " + ", ".join(forbidden.imports))
    if forbidden.torch_ops:
        rules.append("forbidden torch ops: " + ", ".join(forbidden.torch_ops))
    if forbidden.allowed_torch_ops is not None:
        rules.append("torch ops allowed besides allocation, views and copies: "
                     + (", ".join(forbidden.allowed_torch_ops) or "none"))
    if forbidden.max_launches:
        rules.append(f"at most {forbidden.max_launches} kernel launches per call")
    return "\n\n".join(filter(None, [
        f"Problem `{spec.name}` ({backend}). Make this PyTorch reference faster on {gpu}.",
        spec.description.strip(),
        f"```python\n{reference.rstrip()}\n```",
        f"Timed shapes: {shapes}." if shapes else "",
        _regime_line(spec),
        _CONTRACT,
        "Rules for this problem: " + "; ".join(rules) + "." if rules else "",
        f"You have {max_turns} attempt(s); after each you get the compiler, correctness and profiler feedback."
        + (f" The episode also has a wall-clock budget of {_duration(budget_s)} (your replies and the evaluations "
           "together); no new attempt starts after it." if budget_s else ""),
    ]))


def _regime_line(spec: ProblemSpec) -> str:
    if isinstance(spec.regime, list):
        per_shape = "; ".join(f"{regime} at {', '.join(f'{k}={v}' for k, v in shape.items())}"
                              for regime, shape in zip(spec.regime, spec.shapes.gpu))
        return f"Its roofline regime on this GPU class differs by shape: {per_shape}."
    return f"At these shapes the problem is {spec.regime} on this GPU class (its roofline regime)." if spec.regime else ""


def feedback_prompt(feedback: str, turn: int, max_turns: int, no_code: bool) -> str:
    """The user message after an evaluation."""
    head = ("Your last reply had no complete ```python code block, so nothing ran. " if no_code else "")
    left = max_turns - turn
    tail = (f"You have {left} attempt(s) left. Reply with the whole improved module in one ```python block."
            if left > 0 else "That was your last attempt.")
    return f"{head}Feedback on attempt {turn}:\n\n{feedback.strip()}\n\n{tail}"
