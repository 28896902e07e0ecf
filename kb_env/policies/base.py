"""The policy protocol: observation in, kernel source out, state per episode.

A `Policy` starts one `Agent` per episode; the agent holds that episode's state (a chat
history, the turn count) and answers each observation with candidate source. Agents are
plain picklable objects: in a Ray rollout they travel to CPU workers, act there and come back
with their updated state, so the GPUs that evaluate never run a policy."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Agent(Protocol):
    """One episode's policy state."""

    def act(self, observation: dict[str, Any]) -> str:
        """Candidate source for this observation (`reference`, `feedback`, `turn`). An agent may
        also define `last_info() -> dict` (its last turn's prompt, reply, tokens, cost), which
        rollouts store in the trajectory."""
        ...


@runtime_checkable
class Policy(Protocol):
    """Makes a fresh agent for each episode. `name` labels trajectories and boards."""

    name: str

    def start(self, problem: str, seed: int) -> Agent:
        ...
