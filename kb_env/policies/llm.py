"""LLM agents through the official SDKs: OpenAI-compatible chat completions (OpenAI, OpenRouter,
vLLM, SGLang, DeepSeek and others through `base_url`) and Anthropic messages.

One agent per episode keeps the chat: the first user message states the problem (prompts.py),
each later one is the environment's feedback. The code is the reply's last complete
```python block. Rate limits, timeouts and server errors are retried with exponential backoff
and jitter (honouring Retry-After); a cap on concurrent requests applies per provider and
endpoint within a process. Every turn's prompt, reply, token usage and cost is kept in
`agent.transcript` and reported through `last_info()` into the trajectory."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..problem import get_problem
from .extract import NO_CODE_SOURCE, extract_code
from .prompts import SYSTEM, feedback_prompt, first_prompt

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504, 529}


class ModelConfig(BaseModel):
    """One model as a policy: provider, endpoint, sampling, retries and prices (USD per million tokens).
    Unknown keys are an error (a misspelt `temprature` would otherwise be dropped without a word)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="label in trajectories and boards")
    provider: Literal["openai", "anthropic"]
    model: str
    base_url: str | None = Field(default=None, description="an OpenAI-compatible server's URL (vLLM, SGLang, ...)")
    api_key_env: str | None = Field(default=None, description="environment variable with the key "
                                    "(default OPENAI_API_KEY or ANTHROPIC_API_KEY)")
    backend: Literal["triton", "cuda"] = "triton"
    temperature: float | None = None
    max_tokens: int = Field(default=16384, ge=1)
    reasoning_effort: str | None = Field(default=None, description="OpenAI reasoning models: low, medium, high")
    thinking_budget: int | None = Field(default=None, ge=1024, description="Anthropic extended thinking tokens")
    max_retries: int = Field(default=6, ge=0)
    backoff_s: float = Field(default=2.0, gt=0, description="first retry's mean wait; doubles each retry")
    backoff_max_s: float = Field(default=120.0, gt=0)
    timeout_s: float = Field(default=900.0, gt=0)
    concurrency: int = Field(default=8, ge=1, description="requests in flight per provider endpoint, per process")
    price_in_per_mtok: float | None = None
    price_out_per_mtok: float | None = None
    gpu: str = Field(default="an NVIDIA H100", description="the GPU named in the prompt")

    def key(self) -> str:
        var = self.api_key_env or ("OPENAI_API_KEY" if self.provider == "openai" else "ANTHROPIC_API_KEY")
        value = os.environ.get(var)
        if not value:
            raise RuntimeError(f"{self.name}: set {var} to this provider's API key")
        return value


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


class Turn(BaseModel):
    """One request and its reply."""

    prompt: str
    reply: str
    code_found: bool
    usage: Usage
    seconds: float
    attempts: int = Field(description="requests sent, retries included")


_SEMAPHORES: dict[tuple[str, str], threading.BoundedSemaphore] = {}
_SEM_LOCK = threading.Lock()


def _slot(cfg: ModelConfig) -> threading.BoundedSemaphore:
    key = (cfg.provider, cfg.base_url or "default")
    with _SEM_LOCK:
        if key not in _SEMAPHORES:
            _SEMAPHORES[key] = threading.BoundedSemaphore(cfg.concurrency)
        return _SEMAPHORES[key]


def _retryable(exc: BaseException) -> tuple[bool, float | None]:
    """Whether an SDK error is worth retrying, and the server's Retry-After in seconds if it sent one."""
    import anthropic
    import openai

    if isinstance(exc, (openai.APIConnectionError, anthropic.APIConnectionError)):  # timeouts too
        return True, None
    status = getattr(exc, "status_code", None)
    if status is None or status not in RETRY_STATUS:
        return False, None
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    try:
        after = float(headers.get("retry-after")) if headers.get("retry-after") else None
    except ValueError:
        after = None
    return True, after


class LLMAgent:
    """One episode's chat with one model."""

    def __init__(self, cfg: ModelConfig, problem: str, max_turns: int, budget_s: float | None = None):
        self.cfg = cfg
        self.problem = problem
        self.max_turns = max_turns
        self.budget_s = budget_s
        self.messages: list[dict[str, str]] = []
        self.transcript: list[Turn] = []
        self._no_code = False
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:  # the SDK client stays behind; a new one is made where it lands
        return {k: v for k, v in self.__dict__.items() if k != "_client"} | {"_client": None}

    # ----- the protocol --------------------------------------------------------------------
    def act(self, observation: dict[str, Any]) -> str:
        if not self.messages:
            spec = get_problem(self.problem)
            prompt = first_prompt(spec, self.cfg.backend, self.cfg.gpu, self.max_turns, observation["reference"],
                                  self.budget_s)
        else:
            prompt = feedback_prompt(observation.get("feedback", ""), int(observation.get("turn", 0)),
                                     self.max_turns, self._no_code)
        self.messages.append({"role": "user", "content": prompt})
        started = time.monotonic()
        reply, usage, attempts = self._request()
        self.messages.append({"role": "assistant", "content": reply})
        code = extract_code(reply)
        self._no_code = code is None
        self.transcript.append(Turn(prompt=prompt, reply=reply, code_found=code is not None, usage=usage,
                                    seconds=time.monotonic() - started, attempts=attempts))
        return code if code is not None else NO_CODE_SOURCE

    def last_info(self) -> dict[str, Any]:
        """The last turn (prompt, reply, usage, cost) for the trajectory."""
        return self.transcript[-1].model_dump() if self.transcript else {}

    @property
    def usage(self) -> Usage:
        """Tokens and cost over the episode so far."""
        costs = [t.usage.cost_usd for t in self.transcript]
        return Usage(input_tokens=sum(t.usage.input_tokens for t in self.transcript),
                     output_tokens=sum(t.usage.output_tokens for t in self.transcript),
                     cost_usd=None if any(c is None for c in costs) else sum(costs))

    # ----- requests ------------------------------------------------------------------------
    def _request(self) -> tuple[str, Usage, int]:
        attempt = 0
        while True:
            attempt += 1
            try:
                with _slot(self.cfg):
                    text, tokens_in, tokens_out = self._call()
                return text, self._usage(tokens_in, tokens_out), attempt
            except Exception as exc:  # noqa: BLE001 (only SDK errors that say so are retried)
                retry, after = _retryable(exc)
                if not retry or attempt > self.cfg.max_retries:
                    raise
                mean = min(self.cfg.backoff_max_s, self.cfg.backoff_s * 2 ** (attempt - 1))
                time.sleep(after if after is not None else mean * random.uniform(0.5, 1.5))

    def _usage(self, tokens_in: int, tokens_out: int) -> Usage:
        cost = None
        if self.cfg.price_in_per_mtok is not None and self.cfg.price_out_per_mtok is not None:
            cost = (tokens_in * self.cfg.price_in_per_mtok + tokens_out * self.cfg.price_out_per_mtok) / 1e6
        return Usage(input_tokens=tokens_in, output_tokens=tokens_out, cost_usd=cost)

    def _call(self) -> tuple[str, int, int]:
        cfg = self.cfg
        system = SYSTEM[cfg.backend]
        if cfg.provider == "openai":
            import openai

            if self._client is None:
                self._client = openai.OpenAI(api_key=cfg.key(), base_url=cfg.base_url, max_retries=0,
                                             timeout=cfg.timeout_s)
            kwargs: dict[str, Any] = {"model": cfg.model, "max_completion_tokens": cfg.max_tokens,
                                      "messages": [{"role": "system", "content": system}, *self.messages]}
            if cfg.temperature is not None:
                kwargs["temperature"] = cfg.temperature
            if cfg.reasoning_effort is not None:
                kwargs["reasoning_effort"] = cfg.reasoning_effort
            resp = self._client.chat.completions.create(**kwargs)
            usage = resp.usage
            return (resp.choices[0].message.content or "", getattr(usage, "prompt_tokens", 0) or 0,
                    getattr(usage, "completion_tokens", 0) or 0)
        import anthropic

        if self._client is None:
            self._client = anthropic.Anthropic(api_key=cfg.key(), base_url=cfg.base_url, max_retries=0,
                                               timeout=cfg.timeout_s)
        kwargs = {"model": cfg.model, "max_tokens": cfg.max_tokens, "system": system, "messages": self.messages}
        if cfg.temperature is not None:
            kwargs["temperature"] = cfg.temperature
        if cfg.thinking_budget is not None:
            kwargs["thinking"] = {"type": "enabled", "budget_tokens": cfg.thinking_budget}
        resp = self._client.messages.create(**kwargs)
        text = "".join(block.text for block in resp.content if getattr(block, "type", None) == "text")
        return text, resp.usage.input_tokens or 0, resp.usage.output_tokens or 0


class LLMPolicy:
    """A model as a policy (see ModelConfig). The turn budget told to the model, `max_turns` or
    `turns_by_level[problem level]`, and the wall-clock `budget_s` should match the rollout's (a
    sweep sets both)."""

    def __init__(self, cfg: ModelConfig, max_turns: int = 4, turns_by_level: dict[int, int] | None = None,
                 budget_s: float | None = None):
        if max_turns < 1 or any(n < 1 for n in (turns_by_level or {}).values()):
            raise ValueError(f"turn budgets must be at least 1, not {max_turns} / {turns_by_level}")
        self.cfg = cfg
        self.name = cfg.name
        self.max_turns = max_turns
        self.turns_by_level = dict(turns_by_level or {})
        self.budget_s = budget_s

    def turns_for(self, problem: str) -> int:
        return self.turns_by_level.get(get_problem(problem).level, self.max_turns)

    def start(self, problem: str, seed: int) -> LLMAgent:
        return LLMAgent(self.cfg, problem, self.turns_for(problem), self.budget_s)
