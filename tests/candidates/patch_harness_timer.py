"""Tamper header (the known-good softmax kernel is appended by the tests): reaches into the
harness's own timing module, imported in the same worker process, and makes every measured
call report one nanosecond."""
import kb_env.sandbox.timing as harness_timing

harness_timing._elapsed = lambda start, end: 1e-6
