"""An LLM sweep: one model as a policy over problems x samples, then the boards and the HTML
report. The key comes from the environment (OPENAI_API_KEY or ANTHROPIC_API_KEY, or the
variable named by --key-env); any OpenAI-compatible server works through --base-url.

    python examples/llm_sweep.py --provider openai --model MODEL [--base-url http://localhost:8000/v1]
                                 [--problems softmax rmsnorm] [--samples 1] [--max-turns 4]
                                 [--device auto] [--out runs/llm] [--dry-run]

--dry-run prints the first prompt the model would get and exits (no key, no requests)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kb_env import get_problem
from kb_env.board import render, write_board
from kb_env.policies import ModelConfig
from kb_env.policies.prompts import first_prompt
from kb_env.report import write_report
from kb_env.sweep import SweepConfig, run_sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", choices=["openai", "anthropic"], required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--base-url")
    ap.add_argument("--key-env", help="environment variable holding the API key")
    ap.add_argument("--problems", nargs="+", default=["softmax", "rmsnorm"])
    ap.add_argument("--samples", type=int, default=1)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--ray", action="store_true", help="evaluate on Ray actors, one per GPU")
    ap.add_argument("--out", type=Path, default=Path("runs/llm"))
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    model = ModelConfig(name=args.model, provider=args.provider, model=args.model, base_url=args.base_url,
                        api_key_env=args.key_env, temperature=args.temperature)
    if args.dry_run:
        spec = get_problem(args.problems[0])
        print(first_prompt(spec, model.backend, model.gpu, args.max_turns, spec.reference_source()))
        return
    cfg = SweepConfig(models=[model], problems=args.problems, samples=args.samples, max_turns=args.max_turns,
                      mode=args.device, ray=args.ray)
    added = run_sweep(cfg, args.out)
    print(f"{len(added)} episode(s) run")
    print(render(write_board(args.out)))
    print(f"report: {write_report(args.out)}")


if __name__ == "__main__":
    main()
