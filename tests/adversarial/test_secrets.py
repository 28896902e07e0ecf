"""The grading seeds never reach the candidate through argv, the environment, /proc entries or
files: not its own, not its parent's, not those of the warm worker server it was forked from or
of the warm reference worker (whose cache holds pooled seeds' outputs), nor any file in their
working folders. What it can find it prints, and the test looks for every seed the evaluation
could use, the whole secret pool included."""

from __future__ import annotations

from conftest import requires_cpu_mode

from kb_env import get_problem
from kb_env.evaluate.evaluator import Evaluator

pytestmark = requires_cpu_mode

SNOOP = '''
import os, sys
SEEDS = {seeds!r}
places = {{"argv": " ".join(sys.argv), "environ": repr(dict(os.environ))}}
folders, harness = set(), 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    for entry in ("cmdline", "environ"):
        try:
            text = open(f"/proc/{{pid}}/{{entry}}", "rb").read().decode("latin-1")
        except OSError:
            continue
        places[pid + "/" + entry] = text
        harness += entry == "cmdline" and "kb_env.sandbox" in text
    try:
        cwd = os.readlink(f"/proc/{{pid}}/cwd")
    except OSError:
        continue
    for folder in (cwd, os.path.dirname(cwd)):  # the harness's workers run in /tmp/kb_*[/role]
        if os.path.basename(folder).startswith("kb_"):
            folders.add(folder)
for folder in folders:
    for root, _, files in os.walk(folder):
        for name in files:
            if name == "candidate.py":  # this file: it holds the seeds the test planted to search for
                continue
            try:
                places[os.path.join(root, name)] = open(os.path.join(root, name), "rb").read(1 << 20).decode("latin-1")
            except OSError:
                pass
found = sorted(p for p, text in places.items() for s in SEEDS if s in text)
print("SNOOPED", len(places), "HARNESS", harness, "FOLDERS", len(folders), "FOUND", found)
'''


def test_seeds_are_not_in_argv_environment_proc_or_files(softmax_solution):
    spec = get_problem("softmax")
    with Evaluator(spec, "cpu") as ev:
        assert ev.evaluate(softmax_solution, salt=1).correct  # the reference worker is warm from here on
        salt = 424242
        seeds = [str(s) for s in ev.seeds_of(salt)]
        result = ev.evaluate(SNOOP.format(seeds=seeds) + softmax_solution, salt=salt)
    assert result.correct, result.message
    assert result.perf is not None and result.perf.reference_start == "warm"
    line = next(ln for ln in result.candidate_output.splitlines() if ln.startswith("SNOOPED"))
    words = line.split()
    # it really looked: its own argv and environment, every process's /proc entries (the server,
    # the reference worker and itself among them) and the working folders of the harness's workers
    assert int(words[1]) >= 8 and int(words[3]) >= 2 and int(words[5]) >= 2, line
    assert line.endswith("FOUND []"), line
