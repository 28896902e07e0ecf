"""Policies: what writes the candidates (observation in, kernel source out)."""

from .base import Agent, Policy
from .llm import LLMAgent, LLMPolicy, ModelConfig
from .builtin import KnownGoodPolicy, ReferencePolicy, ScriptedPolicy, SequenceAgent, get_policy

__all__ = ["Agent", "Policy", "KnownGoodPolicy", "ReferencePolicy", "ScriptedPolicy", "SequenceAgent",
           "get_policy", "LLMAgent", "LLMPolicy", "ModelConfig"]
