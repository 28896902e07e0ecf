"""LLM policies end to end through the real OpenAI and Anthropic SDKs against a scripted server
on loopback: a rate limit is retried, a reply without code and a broken kernel get clear
feedback, the environment's feedback goes back as the next user message, and tokens and cost
are counted. Episodes run in CPU mode."""

from __future__ import annotations

import pytest
from conftest import requires_cpu_mode
from llm_server import ScriptedLLMServer

from kb_env.env import KernelBenchEnv
from kb_env.policies.extract import extract_code
from kb_env.policies.llm import LLMPolicy, ModelConfig

BROKEN = "```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x)\n        return x\n```"


def _fenced(source: str) -> str:
    return f"Here is a faster kernel.\n\n```python\n{source}```\nIt fuses the max, exp and sum."


def test_extract_takes_the_last_complete_python_block():
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2\n"
    assert extract_code("```bash\nls\n```") is None
    assert extract_code("```python\nx = 1\n```\n```python\nunterminated = True\n") == "x = 1\n"
    assert extract_code("no code at all") is None
    assert extract_code("~~~\nplain = 1\n~~~") == "plain = 1\n"


def _episode(provider: str, base: str, replies: list[dict], monkeypatch, max_turns: int = 3):
    monkeypatch.setenv("KB_TEST_KEY", "sk-test")
    cfg = ModelConfig(name=f"scripted-{provider}", provider=provider, model="scripted-1", api_key_env="KB_TEST_KEY",
                      base_url=base, backoff_s=0.01, price_in_per_mtok=3.0, price_out_per_mtok=15.0)
    env = KernelBenchEnv("softmax", device="cpu", max_turns=max_turns)
    obs, _ = env.reset(seed=0)
    agent = LLMPolicy(cfg, max_turns=max_turns).start("softmax", 0)
    infos = []
    for _ in range(max_turns):
        obs, reward, _, truncated, info = env.step(agent.act(obs))
        infos.append((reward, info, obs["feedback"]))
    return agent, infos


@requires_cpu_mode
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_llm_episode_through_the_sdk(provider, softmax_solution, monkeypatch):
    replies = [{"status": 429, "retry_after": 0}, {"text": "I think we should use shared memory."},
               {"text": BROKEN}, {"text": _fenced(softmax_solution), "input_tokens": 2000, "output_tokens": 1000}]
    with ScriptedLLMServer(replies) as server:
        base = server.url + ("/v1" if provider == "openai" else "")
        agent, infos = _episode(provider, base, replies, monkeypatch)
        requests = server.requests
    (r1, i1, fb1), (r2, i2, fb2), (r3, i3, fb3) = infos
    # Turn 1: a rate limit, retried; then a reply without code: nothing ran, and it says so.
    assert agent.transcript[0].attempts == 2 and not agent.transcript[0].code_found
    assert i1["error"] == "compile_error" and "no code block" in fb1
    # Turn 2: the feedback went back to the model; the broken kernel is a compile error.
    second = requests[2][1]
    last_user = second["messages"][-1]["content"]
    assert "no complete ```python code block" in last_user and "Feedback on attempt 1" in last_user
    assert i2["error"] == "compile_error" and "SyntaxError" in fb2
    # Turn 3: the known-good kernel, extracted from prose around the block, is correct.
    assert i3["correct"] and r3 > r2
    assert requests[3][1]["messages"][-1]["content"].count("SyntaxError") >= 1
    # The first prompt states the problem, the contract and the budget.
    first = requests[0][1]["messages"][-1]["content"] if provider == "anthropic" else requests[0][1]["messages"][1]["content"]
    assert "softmax" in first and "ModelNew" in first and "3 attempt(s)" in first
    # Tokens and cost: 100+50 for each of the first two replies, 2000+1000 for the third.
    assert agent.usage.input_tokens == 2200 and agent.usage.output_tokens == 1100
    assert agent.usage.cost_usd == pytest.approx((2200 * 3.0 + 1100 * 15.0) / 1e6)
    assert agent.last_info()["usage"]["output_tokens"] == 1000


def test_errors_that_are_not_transient_are_raised(monkeypatch):
    with ScriptedLLMServer([{"status": 400}]) as server:
        monkeypatch.setenv("KB_TEST_KEY", "sk-test")
        cfg = ModelConfig(name="m", provider="openai", model="x", base_url=server.url + "/v1", api_key_env="KB_TEST_KEY")
        agent = LLMPolicy(cfg, max_turns=1).start("softmax", 0)
        import openai

        with pytest.raises(openai.BadRequestError):
            agent.act({"reference": "x", "feedback": "", "turn": 0})
        assert len(server.requests) == 1


def test_retries_give_up_after_max_retries(monkeypatch):
    with ScriptedLLMServer([{"status": 503}] * 3) as server:
        monkeypatch.setenv("KB_TEST_KEY", "sk-test")
        cfg = ModelConfig(name="m", provider="anthropic", model="x", base_url=server.url, api_key_env="KB_TEST_KEY",
                          max_retries=2, backoff_s=0.01)
        agent = LLMPolicy(cfg, max_turns=1).start("softmax", 0)
        import anthropic

        with pytest.raises(anthropic.APIStatusError):
            agent.act({"reference": "x", "feedback": "", "turn": 0})
        assert len(server.requests) == 3


def test_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("KB_NO_SUCH_KEY", raising=False)
    cfg = ModelConfig(name="m", provider="openai", model="x", api_key_env="KB_NO_SUCH_KEY")
    agent = LLMPolicy(cfg).start("softmax", 0)
    with pytest.raises(RuntimeError, match="set KB_NO_SUCH_KEY"):
        agent.act({"reference": "x", "feedback": "", "turn": 0})
    with pytest.raises(ValueError):
        LLMPolicy(cfg, max_turns=0)


def test_agent_travels_pickled_between_turns(monkeypatch):
    """What a Ray rollout does: the agent (without its SDK client) goes to a CPU worker and back."""
    import pickle

    with ScriptedLLMServer([{"text": "```python\na = 1\n```"}, {"text": "```python\nb = 2\n```"}]) as server:
        monkeypatch.setenv("KB_TEST_KEY", "sk-test")
        cfg = ModelConfig(name="m", provider="openai", model="x", base_url=server.url + "/v1", api_key_env="KB_TEST_KEY")
        agent = LLMPolicy(cfg, max_turns=2).start("softmax", 0)
        assert agent.act({"reference": "ref", "feedback": "", "turn": 0}) == "a = 1\n"
        clone = pickle.loads(pickle.dumps(agent))
        assert clone.act({"reference": "ref", "feedback": "WRONG ANSWER at [3]", "turn": 1}) == "b = 2\n"
        history = server.requests[1][1]["messages"]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert "WRONG ANSWER at [3]" in history[-1]["content"] and len(clone.transcript) == 2
