"""kb_env: KernelBench-style GPU kernel problems as Gymnasium environments.

Importing the package registers ``KernelBench/<name>-v0`` for every problem folder: the shipped
ones and those imported from KernelBench files (`register_kernelbench`, ``kb import``)."""

from __future__ import annotations

__version__ = "0.1.0"


def _register_all() -> None:
    import gymnasium as gym

    from .problem import problem_names

    for name in problem_names():
        env_id = f"KernelBench/{name}-v0"
        if env_id in gym.registry:
            continue
        # Timing noise makes GPU rewards nondeterministic; CPU-mode rewards are deterministic.
        gym.register(id=env_id, entry_point="kb_env.env:KernelBenchEnv", kwargs={"problem": name},
                     nondeterministic=True, disable_env_checker=False)


_register_all()

from .evaluate import EvalResult, evaluate  # noqa: E402
from .kernelbench import register_kernelbench  # noqa: E402
from .problem import ProblemSpec, all_problems, get_problem, load_problem  # noqa: E402

__all__ = ["EvalResult", "ProblemSpec", "all_problems", "evaluate", "get_problem", "load_problem",
           "register_kernelbench"]
