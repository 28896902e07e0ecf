"""A candidate that segfaults, exits early, hangs, prints a fake result or tampers with the
harness leaves the environment working for the next step."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import candidate, requires_cpu_mode, tampered

import kb_env  # noqa: F401

pytestmark = requires_cpu_mode


@pytest.fixture(scope="module")
def env():
    e = gym.make("KernelBench/softmax-v0", device="cpu", max_turns=100, timeout_s=30)
    e.reset(seed=7)
    yield e
    e.close()


def _good_step_still_works(env, solution):
    _, reward, _, _, info = env.step(solution)
    assert info["correct"] and info["error"] is None, info["result"]["message"]
    return reward


def test_segfault_is_a_crash_and_env_survives(env, softmax_solution):
    _, reward, _, _, info = env.step(candidate("segfault"))
    assert info["error"] == "crash" and not info["correct"]
    assert "SIGSEGV" in info["result"]["message"]
    assert _good_step_still_works(env, softmax_solution) > reward


def test_os_exit_is_a_crash(env, softmax_solution):
    _, _, _, _, info = env.step(candidate("exit_early"))
    assert info["error"] == "crash"
    assert "status 0" in info["result"]["message"]
    _good_step_still_works(env, softmax_solution)


def test_hang_times_out(softmax_solution):
    e = gym.make("KernelBench/softmax-v0", device="cpu", timeout_s=12)
    e.reset(seed=0)
    _, reward, _, _, info = e.step(candidate("hang"))
    assert info["error"] == "timeout" and not info["correct"]
    assert info["result"]["wall_s"] < 40
    _good_step_still_works(e, softmax_solution)


def test_fake_stdout_is_ignored(env, softmax_solution):
    obs, reward, _, _, info = env.step(candidate("fake_stdout"))
    assert info["correct"] is False and info["error"] == "mismatch"
    assert info["speedup"] is None
    # What it printed is shown to the agent as its output, and nothing more.
    assert '"speedup": 100.0' in info["result"]["candidate_output"]
    assert "not used for grading" in obs["feedback"]
    _good_step_still_works(env, softmax_solution)


def test_patched_timer_is_flagged(env):
    _, reward, _, _, info = env.step(tampered("patch_timer"))
    assert info["correct"] is True
    assert "patched:torch.cuda.synchronize" in info["flags"]
    assert "patched:torch.cuda.Event.elapsed_time" in info["flags"]
    assert info["error"] == "integrity" and reward == 0.0


def test_global_precision_flags_are_flagged(env):
    _, reward, _, _, info = env.step(tampered("tf32_flag"))
    assert "torch_flag:matmul.allow_tf32" in info["flags"]
    assert "torch_flag:float32_matmul_precision" in info["flags"]
    assert reward == 0.0


def test_tensor_subclass_output_is_rejected(env):
    _, _, _, _, info = env.step(candidate("subclass_output"))
    assert not info["correct"] and info["error"] in ("mismatch", "integrity")
    assert "tensor_subclass" in info["flags"]


def test_forbidden_import_is_flagged_without_running(env):
    src = "import ctypes\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    _, reward, _, _, info = env.step(src)
    assert info["error"] == "integrity" and "forbidden_import:ctypes" in info["flags"]
    assert info["result"]["wall_s"] < 2  # decided from the source alone
    assert reward == 0.0


def test_no_secret_environment_reaches_the_candidate(monkeypatch, softmax_solution):
    from kb_env.sandbox.runner import worker_env

    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("KB_SEED", "1234")
    env = worker_env("cpu", __import__("pathlib").Path("/tmp"))
    assert "OPENAI_API_KEY" not in env and "KB_SEED" not in env
    assert env["TRITON_INTERPRET"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""


def test_writing_into_the_result_pipe_is_a_protocol_violation(env, softmax_solution):
    _, reward, _, _, info = env.step(candidate("forge_channel"))
    assert not info["correct"] and info["error"] == "crash"
    assert "protocol_violation" in info["flags"]
    assert reward == 0.0
    _good_step_still_works(env, softmax_solution)


def test_triton_compile_error_on_first_call_is_a_compile_error(env):
    obs, reward, _, _, info = env.step(candidate("triton_compile_error"))
    assert info["error"] == "compile_error" and info["compiled"] is False
    assert "no_such_function" in obs["feedback"]
    assert reward == 0.0


def test_patching_the_harness_module_itself_is_flagged(env):
    _, reward, _, _, info = env.step(tampered("patch_harness_timer"))
    assert "patched:kb_env.sandbox.timing._elapsed" in info["flags"]
    assert info["error"] == "integrity" and reward == 0.0


def test_rewriting_problem_files_is_flagged_and_stops_the_evaluator(tmp_path, softmax_solution):
    import shutil

    from kb_env.env import KernelBenchEnv
    from kb_env.evaluate.evaluator import HarnessError
    from kb_env.problem import get_problem, load_problem

    folder = tmp_path / "softmax"  # a copy: the candidate really rewrites it
    shutil.copytree(get_problem("softmax").folder, folder)
    target = folder / "reference.py"
    attack = (f"open({str(target)!r}, 'a').write('\\nclass Model(Model):\\n    def forward(self, x):\\n"
              f"        return torch.zeros_like(x)\\n')\n") + softmax_solution
    env = KernelBenchEnv(load_problem(folder), device="cpu", max_turns=3)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(attack)
    assert "modified_harness_files" in info["flags"] and info["error"] == "integrity" and reward == 0.0
    with pytest.raises(HarnessError, match="changed on disk"):
        env.step(softmax_solution)


def test_flooding_stdout_is_bounded(softmax_solution):
    from kb_env.env import KernelBenchEnv
    from kb_env.problem import get_problem

    spec = get_problem("softmax")
    small = spec.model_copy(update={"limits": spec.limits.model_copy(update={"max_file_mb": 8})})
    e = KernelBenchEnv(small, device="cpu", max_turns=2)
    e.reset(seed=0)
    _, _, _, _, info = e.step(candidate("flood_stdout"))
    assert not info["correct"] and info["error"] == "runtime_error"
    assert "File too large" in info["result"]["message"]
    assert len(info["result"]["candidate_output"]) <= 4000  # only the tail reaches the agent
    _good_step_still_works(e, softmax_solution)
