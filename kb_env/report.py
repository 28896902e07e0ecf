"""Plots and a static HTML report of a sweep: the boards, PNG plots (matplotlib) and a
per-episode transcript viewer (each turn's prompt, reply, candidate, feedback and reward). The
report is one HTML file beside `plots/`; it needs no server and no network."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .board import FAST_P, boards, table_rows
from .rollout import Trajectory, read_jsonl
from .sweep import RESULTS

PLOTS = (FAST_P_PLOT, PEAK_PLOT, LEVELS_PLOT, MEGA_PLOT) = (
    "fast_p.png", "peak_fraction.png", "rates_by_level.png", "mega_tok_s.png")


def _save(fig, path: Path, files: list[Path]) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _bars(ax, groups: list[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / max(1, len(series))
    for k, (label, vals) in enumerate(series.items()):
        ax.bar([i + k * width for i in range(len(groups))], vals, width, label=label)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(groups))], groups,
                  rotation=30 if len(groups) > 6 else 0, ha="right" if len(groups) > 6 else "center")
    if series:
        ax.legend(fontsize="small")


def plot(board: dict[str, Any], out: Path) -> list[Path]:
    """The boards as PNGs under `out` (fast_p curves, peak_fraction bars, v3 rates per level,
    Mega tokens per second); returns the files written. A board with nothing to draw gets a plot
    that says so, so every sweep has the same files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    cpu_note = "" if board["timing_meaningful"] else " (CPU mode: only p=0 is meaningful)"

    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, row in board["fast_p"].items():
        pts = [(p, row[f"fast_{p:g}"]) for p in FAST_P if row[f"fast_{p:g}"] is not None]
        ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=policy)
    ax.set_xlabel("speedup threshold p")
    ax.set_ylabel("fast_p (share of all tasks)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(-0.1, max(FAST_P) + 0.1)
    ax.set_title("fast_p" + cpu_note)
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, out / FAST_P_PLOT, files)

    problems = sorted({p for rows in board["peak_fraction"].values() for p in rows})
    policies = list(board["peak_fraction"])
    fig, ax = plt.subplots(figsize=(min(16, max(6, 2 + 0.4 * len(problems) * max(1, len(policies)))), 4.5))
    _bars(ax, problems, {pol: [(board["peak_fraction"][pol].get(p) or {}).get("geomean") or 0.0 for p in problems]
                         for pol in policies})
    ax.set_ylabel("peak_fraction (geomean over correct samples)")
    ax.set_ylim(0, 1)
    ax.set_title("peak_fraction by problem" + ("" if board["timing_meaningful"] else " (CPU mode: none measured)"))
    _save(fig, out / PEAK_PLOT, files)

    levels = sorted({lv for rows in board["rates_by_level"].values() for lv in rows})
    metrics = ["compiled", "correct"] + (["beat_baseline"] if board["timing_meaningful"] else [])
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        _bars(ax, [f"L{lv}" for lv in levels],
              {pol: [(rows.get(lv) or {}).get(metric) or 0.0 for lv in levels]
               for pol, rows in board["rates_by_level"].items()})
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{metric} share by level")
    _save(fig, out / LEVELS_PLOT, files)

    mega = board["mega"]
    fig, axes = plt.subplots(1, max(1, len(mega)), figsize=(6 * max(1, len(mega)), 4), squeeze=False)
    if not mega:
        _empty(axes[0][0], "no level-4 (Mega) problem in these results")
    for ax, (problem, rows) in zip(axes[0], mega.items()):
        shapes = list(dict.fromkeys(k for r in rows.values() for k in (*r["tok_s"], *r["baseline_tok_s"])))
        if not shapes:
            _empty(ax, f"{problem}: no timed correct step" + ("" if board["timing_meaningful"] else " (CPU mode)"))
            continue
        series = {pol: [r["tok_s"].get(s) or 0.0 for s in shapes] for pol, r in rows.items()}
        base = {s: [r["baseline_tok_s"][s] for r in rows.values() if r["baseline_tok_s"].get(s)] for s in shapes}
        series["baseline"] = [max(base[s]) if base[s] else 0.0 for s in shapes]
        _bars(ax, shapes, series)
        ax.set_ylabel("decode tokens per second")
        ax.set_title(f"{problem}: tok/s by context")
    _save(fig, out / MEGA_PLOT, files)
    return files


def _table(title: str, cols: list[str], rows: list[list[Any]]) -> str:
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))  # noqa: E731
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _episodes(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    out = []
    for t in sorted(trajs, key=lambda t: (t.policy, t.task.problem, t.task.seed)):
        out.append({"policy": t.policy, "problem": t.task.problem, "seed": t.task.seed, "error": t.error,
                    "budget_spent": t.budget_spent,
                    "turns": [{"turn": s.turn, "reward": s.reward, "correct": s.info.get("correct"),
                               "error": s.info.get("error"), "flags": s.info.get("flags") or [],
                               "speedup": s.info.get("speedup"),
                               "prompt": s.policy_info.get("prompt", ""), "reply": s.policy_info.get("reply", ""),
                               "candidate": s.action, "feedback": s.observation.get("feedback", "")}
                              for s in t.steps]})
    return out


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
#episodes li{cursor:pointer;margin:2px 0}#episodes li:hover{text-decoration:underline}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:24em;white-space:pre-wrap}
.turn{border-left:3px solid #888;padding-left:1em;margin:1em 0}.ok{color:#070}.bad{color:#a00}
#episodes li.selected{font-weight:bold}img{max-width:100%}"""

_SCRIPT = """
const episodes = JSON.parse(document.getElementById('episodes-data').textContent);
const list = document.getElementById('episodes'), view = document.getElementById('viewer');
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; }
function verdict(t) {
  if (t.correct && !t.flags.length) return 'correct' + (t.speedup == null ? '' : ', speedup ' + t.speedup.toFixed(2) + 'x');
  return (t.error || 'wrong') + (t.flags.length ? ' (flags: ' + t.flags.join(', ') + ')' : '');
}
function show(i) {
  const ep = episodes[i]; view.replaceChildren(el('h3', ep.policy + ' / ' + ep.problem + ' / sample ' + ep.seed));
  for (const li of list.children) li.classList.toggle('selected', li.id === 'ep-' + i);
  if (ep.error) view.appendChild(el('p', 'episode error: ' + ep.error, 'bad'));
  if (ep.budget_spent) view.appendChild(el('p', 'stopped early: the wall-clock budget was spent'));
  for (const t of ep.turns) {
    const d = el('div', undefined, 'turn');
    const ok = t.correct && !t.flags.length;
    d.appendChild(el('h4', 'turn ' + t.turn + ': reward ' + t.reward.toFixed(3) + ', ' + verdict(t), ok ? 'ok' : 'bad'));
    for (const [name, text] of [['prompt', t.prompt], ['reply', t.reply], ['candidate', t.candidate], ['feedback', t.feedback]]) {
      if (!text) continue; const s = el('details'); if (name === 'feedback') s.open = true;
      s.appendChild(el('summary', name)); s.appendChild(el('pre', text)); d.appendChild(s);
    }
    view.appendChild(d);
  }
}
episodes.forEach((ep, i) => { const li = el('li', ep.policy + ' / ' + ep.problem + ' / sample ' + ep.seed + ' (' + ep.turns.length + ' turns)'); li.id = 'ep-' + i; li.onclick = () => show(i); list.appendChild(li); });
if (episodes.length) show(0);
"""


def write_report(out: Path) -> Path:
    """Boards, plots and the transcript viewer for `<out>/results.jsonl`; returns report.html."""
    out = Path(out)
    path = out / RESULTS
    if not path.exists():
        raise FileNotFoundError(f"{path}: no results (run `kb sweep --out {out}` first)")
    trajs = read_jsonl(path)
    board = boards(trajs)
    pngs = plot(board, out / "plots")
    note = "" if board["timing_meaningful"] else "<p><em>CPU mode: timings are not meaningful; speedup columns are empty.</em></p>"
    tables = "\n".join(_table(title, cols, rows) for title, (cols, rows) in table_rows(board).items())
    data = json.dumps(_episodes(trajs)).replace("</", "<\\/")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>kb_env sweep: {html.escape(out.name)}</title>
<style>{_STYLE}</style></head><body><h1>kb_env sweep: {html.escape(out.name)}</h1>{note}
{tables}
{"".join(f'<img src="plots/{p.name}" alt="{p.stem}">' for p in pngs)}
<h2>Episodes</h2><ul id="episodes"></ul><div id="viewer"></div>
<script type="application/json" id="episodes-data">{data}</script><script>{_SCRIPT}</script></body></html>"""
    report = out / "report.html"
    report.write_text(page)
    return report
