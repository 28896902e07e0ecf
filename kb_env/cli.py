"""The `kb` command: `kb list`, `kb eval PROBLEM FILE`, `kb audit FILE --problem P`,
`kb sweep --out DIR ...`, `kb board DIR`, `kb report DIR`, `kb replay MANIFEST --out DIR` and
`kb bench`.

Bad input (unknown problem, missing file, a file that is not Python or defines no model)
gets one line on stderr and exit status 2; an evaluated candidate prints its report and exits
0 when correct and unflagged, 1 otherwise."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


class CLIError(Exception):
    """A one-line message for the user; no traceback."""


def _cmd_list(args: argparse.Namespace) -> int:
    from .problem import all_problems

    problems = all_problems()
    if args.json:
        print(json.dumps({n: {"description": s.description.strip().splitlines()[0], "level": s.level,
                              "interface": s.interface.value, "regime": s.regime, "baseline": s.baseline.value,
                              "gpu_only": s.gpu_only, "gpu_shapes": s.shapes.gpu, "cpu_shapes": s.shapes.cpu,
                              "solutions": [p.name for p in s.solution_paths]} for n, s in problems.items()}, indent=2))
        return 0
    width = max((len(n) for n in problems), default=4)
    print(f"{'problem':<{width}}  {'env id':<{width + 17}}  level  {'regime':<13}  {'baseline':<11}  description")
    for name, spec in sorted(problems.items(), key=lambda kv: (kv[1].level, kv[0])):
        regime = spec.regime_label or "-"
        print(f"{name:<{width}}  {spec.env_id():<{width + 17}}  {spec.level:^5}  {regime:<13}  "
              f"{spec.baseline.value:<11}  {spec.description.strip().splitlines()[0]}")
    return 0


def _read_candidate(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise CLIError(f"{path}: no such file")
    if not p.is_file():
        raise CLIError(f"{path}: not a file")
    try:
        return p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise CLIError(f"{path}: not a text file (expected Python source)") from None


def _run_evaluation(args: argparse.Namespace):
    """Evaluate args.file on args.problem as the eval and audit commands both do."""
    from .env import resolve_device
    from .evaluate.evaluator import Evaluator, HarnessError
    from .evaluate.static import check_source
    from .problem import ProblemError, get_problem

    try:
        spec = get_problem(args.problem)
    except ProblemError as exc:
        raise CLIError(str(exc)) from None
    source = _read_candidate(args.file)
    static = check_source(source, spec.forbidden.imports)
    if static.error:
        raise CLIError(f"{args.file}: {static.error.splitlines()[0]}")
    try:
        mode = resolve_device(args.device)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.timeout is not None and args.timeout <= 0:
        raise CLIError("--timeout must be positive")
    if mode == "cpu" and spec.gpu_only:
        raise CLIError(f"{spec.name} is GPU-only (it declares no CPU shapes); evaluate it on a GPU (--device cuda)")
    progress = None
    if not args.json:
        print(f"evaluating {args.file} on {spec.name} ({mode} mode)", file=sys.stderr)
        if sys.stderr.isatty():
            progress = lambda stage: print(f"\r\033[K  {stage} ...", end="", file=sys.stderr, flush=True)  # noqa: E731
    try:
        # a fixed --seed fixes every input: the salt and the pool of grading seeds
        with Evaluator(spec, mode, args.timeout, progress=progress, pool_key=args.seed) as evaluator:
            result = evaluator.evaluate(source, args.seed)
        if progress:
            print("\r\033[K", end="", file=sys.stderr)
    except HarnessError as exc:
        raise CLIError(f"the harness failed (not the candidate's fault): {str(exc).splitlines()[0]}") from None
    return result


def _cmd_eval(args: argparse.Namespace) -> int:
    from .feedback import render

    result = _run_evaluation(args)
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        from rewards import get_reward

        print(render(result))
        print(f"\nreward (default): {get_reward('default')(result):.3f}   wall time: {result.wall_s:.1f} s")
        if result.stage_s:
            print("where the time went: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.stage_s.items()))
    return 0 if result.correct and not result.flags else 1


def _cmd_audit(args: argparse.Namespace) -> int:
    from .audit import render, verdicts

    result = _run_evaluation(args)
    if args.json:
        print(json.dumps({"verdicts": [v.model_dump() for v in verdicts(result)], "flags": result.flags,
                          "correct": result.correct, "error": result.error.value if result.error else None}, indent=2))
    else:
        print(render(result))
    return 0 if result.correct and not result.flags else 1


def _cmd_sweep(args: argparse.Namespace) -> int:
    import yaml

    from .board import render, write_board
    from .report import write_report
    from .sweep import SweepConfig, load_config, run_sweep

    if not args.config and not args.policies:
        raise CLIError("name the policies (--policies reference known-good) or give a --config file")
    try:  # every check of the input happens here, before anything runs
        if args.config:
            cfg = load_config(Path(args.config))
            if args.only:
                cfg = cfg.only(args.only)
            overrides = {k: v for k, v in [("problems", args.problems), ("levels", args.levels), ("mode", args.device),
                                           ("samples", args.samples), ("actors", args.actors)] if v is not None}
            if args.ray:
                overrides["ray"] = True
            cfg = SweepConfig.model_validate(cfg.model_dump() | overrides)
        else:
            if args.only:
                raise CLIError("--only picks from a --config file's policies and models")
            cfg = SweepConfig(policies=args.policies, problems=args.problems, levels=args.levels,
                              samples=1 if args.samples is None else args.samples,
                              max_turns=1 if args.max_turns is None else args.max_turns, mode=args.device or "auto",
                              ray=args.ray, actors=args.actors)
        cfg.problem_names()
        cfg.check_keys()
    except (ValueError, RuntimeError, OSError, yaml.YAMLError) as exc:  # pydantic's ValidationError is a ValueError
        raise CLIError(" ".join(str(exc).split())) from None
    added = run_sweep(cfg, Path(args.out), progress=not args.quiet)
    print(f"{len(added)} episode(s) run; results in {Path(args.out) / 'results.jsonl'}")
    print(render(write_board(Path(args.out))))
    print(f"report: {write_report(Path(args.out))}")
    return 0


def _cmd_board(args: argparse.Namespace) -> int:
    from .board import render, write_board

    try:
        board = write_board(Path(args.dir))
    except FileNotFoundError as exc:
        raise CLIError(str(exc)) from None
    print(json.dumps(board, indent=1) if args.json else render(board))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    try:
        path = write_report(Path(args.dir))
    except FileNotFoundError as exc:
        raise CLIError(str(exc)) from None
    print(f"report: {path} (plots in {path.parent / 'plots'})")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from .replay import Manifest, ReplayPolicy, render_replay, replay_board
    from .rollout import LocalPool, read_jsonl, rollout
    from .sweep import RESULTS

    try:
        manifest = Manifest.load(Path(args.manifest))
    except (ValidationError, ValueError, FileNotFoundError, OSError) as exc:
        raise CLIError(str(exc).splitlines()[0]) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / RESULTS
    done = {t.task.seed for t in read_jsonl(results) if t.policy == ReplayPolicy.name} if results.exists() else set()
    todo = [t for t in manifest.tasks() if t.seed not in done]
    if args.ray:
        import ray

        from .rollout import EvaluatorPool

        ray.init(include_dashboard=False, log_to_driver=False)
        pool = EvaluatorPool(num_actors=args.actors, mode=args.device)
    else:
        pool = LocalPool(args.device, args.actors or 1)
    with pool:
        for _ in rollout(ReplayPolicy(manifest), todo, pool, max_turns=1, out=results, progress=not args.quiet,
                         remote_policy=args.ray):
            pass
    board = replay_board(manifest, read_jsonl(results))
    (out / "replay.json").write_text(json.dumps(board, indent=1))
    (out / "replay.md").write_text(render_replay(board))
    print(render_replay(board))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_cli
    from .problem import ProblemError

    try:
        return run_cli(args)
    except (ProblemError, ValueError) as exc:
        raise CLIError(str(exc).splitlines()[0]) from None


def _cmd_import(args: argparse.Namespace) -> int:
    from .kernelbench import Budget, register_kernelbench

    if args.timeout is not None and args.timeout <= 0:
        raise CLIError("--timeout must be positive")
    budget = Budget(timeout_s=args.timeout) if args.timeout else Budget()
    progress = None if args.quiet or args.json else (lambda f: print(f"  probing {f}", file=sys.stderr, flush=True))
    try:
        report = register_kernelbench(args.dir, cache_dir=args.cache, device=args.device, force=args.force,
                                      require_checks=args.require_checks, forbid_ops=args.forbid_ops,
                                      budget=budget, progress=progress)
    except (FileNotFoundError, ValueError) as exc:
        raise CLIError(str(exc)) from None
    print(report.model_dump_json(indent=2) if args.json else report.render())
    if args.cache and not args.json:
        print(f"(other processes see these problems with KB_PROBLEM_PATH={Path(args.cache).resolve()})")
    return 0


def _evaluation_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="cuda, cpu (Triton interpreter, small shapes), or auto (default)")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the whole evaluation")
    p.add_argument("--seed", type=int, default=None, help="fix the input seeds (default: secret and random)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kb", description="kb_env: GPU kernel problems as Gymnasium environments")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="list the problems and their environment ids")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser("eval", help="evaluate one candidate file on one problem")
    p.add_argument("problem", help="problem name (see `kb list`)")
    p.add_argument("file", help="candidate source: a Python file defining ModelNew")
    _evaluation_args(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("audit", help="run the trust checks on a candidate file and print a verdict per check")
    p.add_argument("file", help="candidate source: a Python file defining ModelNew")
    p.add_argument("--problem", required=True, help="problem name (see `kb list`)")
    _evaluation_args(p)
    p.set_defaults(func=_cmd_audit)

    p = sub.add_parser("sweep", help="run policies x problems x samples (resumable) and print the boards")
    p.add_argument("--out", required=True, help="results folder (a rerun skips what is done there)")
    p.add_argument("--config", help="a sweep or roster YAML/JSON file, e.g. rosters/kernelbench-v3.yaml; "
                                    "--problems, --levels, --samples, --device, --ray and --actors override it")
    p.add_argument("--only", nargs="+", metavar="NAME", help="with --config: run only these of its policies and models")
    p.add_argument("--policies", nargs="+", choices=["reference", "known-good"], help="built-in policies")
    p.add_argument("--problems", nargs="+", help="default: every problem (in CPU mode, every one with CPU shapes)")
    p.add_argument("--levels", nargs="+", type=int, help="only problems of these levels (1-4)")
    p.add_argument("--samples", type=int, help="episodes per (policy, problem) (default 1)")
    p.add_argument("--max-turns", type=int, help="turns per episode (default 1; a --config sets its own)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], help="default: auto")
    p.add_argument("--ray", action="store_true", help="evaluate on Ray actors, one per GPU")
    p.add_argument("--actors", type=int, help="evaluator actors (Ray) or evaluations at once (local, CPU mode)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)

    p = sub.add_parser("board", help="print and write the leaderboards of a sweep's results")
    p.add_argument("dir", help="a `kb sweep --out` folder")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_board)

    p = sub.add_parser("report", help="write plots and a static HTML report (with a transcript viewer) of a sweep")
    p.add_argument("dir", help="a `kb sweep --out` folder")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("bench", help="where an evaluation's time goes, evaluations per GPU-minute, timing "
                                     "spread, agreement with do_bench and ncu (see docs/PERFORMANCE.md)")
    from .bench import add_arguments

    add_arguments(p)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("import", help="register a directory of KernelBench problem files (level1/23_Softmax.py, ...)")
    p.add_argument("dir", help="a KernelBench directory (with level1 ... level4), or one level folder")
    p.add_argument("--cache", help="where the problem folders go (default: the import cache every process reads)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where checks too big for this CPU run (auto: a GPU if there is one)")
    p.add_argument("--force", action="store_true", help="probe every file again, even unchanged ones")
    p.add_argument("--require-checks", action="store_true", help="skip problems the checks could not run on")
    p.add_argument("--forbid-ops", choices=["reference", "all", "none"], default="reference",
                   help="torch ops a candidate may not call: the reference's (default), all compute ops, or none")
    p.add_argument("--timeout", type=float, default=None, help="seconds to probe one file (default 300)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("replay", help="re-grade a published board's solution files; measured vs published")
    p.add_argument("manifest", help="YAML/JSON list of {run_id, model, problem, file, gpu, published_score}")
    p.add_argument("--out", required=True, help="results folder (a rerun skips what is done there)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--ray", action="store_true", help="evaluate on Ray actors, one per GPU")
    p.add_argument("--actors", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CLIError as exc:
        print(f"kb: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kb: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
