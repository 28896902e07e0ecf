"""The grading seeds never reach the candidate through argv, the environment, the parent's
/proc entries or files beside it; what it can find it prints, and the test looks for the seeds."""

from __future__ import annotations

from conftest import requires_cpu_mode

from kb_env import get_problem
from kb_env.evaluate.evaluator import Evaluator, derive_seed

pytestmark = requires_cpu_mode

SNOOP = '''
import os, sys
SEEDS = {seeds!r}
places = {{"argv": " ".join(sys.argv), "environ": repr(dict(os.environ))}}
for pid in ("self", str(os.getppid())):
    for entry in ("cmdline", "environ"):
        try:
            places[pid + "/" + entry] = open(f"/proc/{{pid}}/{{entry}}", "rb").read().decode("latin-1")
        except OSError as exc:
            places[pid + "/" + entry] = ""
for root, _, files in os.walk(os.path.dirname(os.getcwd())):
    for name in files:
        if name == "candidate.py":  # this file: it holds the seeds the test planted to search for
            continue
        try:
            places[os.path.join(root, name)] = open(os.path.join(root, name), "rb").read(1 << 20).decode("latin-1")
        except OSError:
            pass
found = sorted(p for p, text in places.items() for s in SEEDS if s in text)
print("SNOOPED", len(places), "FOUND", found)
'''


def test_seeds_are_not_in_argv_environment_proc_or_files(softmax_solution):
    spec = get_problem("softmax")
    salt = 424242
    seeds = [str(derive_seed(salt, f"grading:{s}")) for s in spec.seeds] + [str(derive_seed(salt, "params"))]
    source = SNOOP.format(seeds=seeds) + softmax_solution
    result = Evaluator(spec, "cpu").evaluate(source, salt=salt)
    assert result.correct, result.message
    line = next(ln for ln in result.candidate_output.splitlines() if ln.startswith("SNOOPED"))
    assert int(line.split()[1]) >= 6  # it really looked: argv, environ, two /proc pairs, files
    assert line.endswith("FOUND []"), line
