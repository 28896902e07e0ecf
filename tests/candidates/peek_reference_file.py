"""Reading the answer: finds the problem's reference.py on disk (through the installed kb_env
package, or the problem directory the harness names), executes it and calls its Model. That
runs torch.softmax, which the dispatcher records: forbidden_op:aten::_softmax."""
from pathlib import Path

import torch


def _reference_model():
    places = []
    try:
        import kb_env
        from kb_env.problem import problems_root

        places += [problems_root() / "softmax" / "reference.py",
                   Path(kb_env.__file__).resolve().parents[1] / "problems" / "softmax" / "reference.py"]
    except Exception:  # noqa: BLE001
        pass
    for path in places:
        if path.is_file():
            scope = {"__name__": "stolen_reference"}
            exec(compile(path.read_text(), str(path), "exec"), scope)
            return scope["Model"]()
    raise RuntimeError("no reference.py found")


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ref = _reference_model()

    def forward(self, x):
        return self.ref(x)
