"""Plots and a static HTML report of a sweep: the boards, PNG plots (matplotlib) and a
per-episode transcript viewer (each turn's prompt, reply, candidate, feedback and reward). The
report is one HTML file beside `plots/`; it needs no server and no network."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from .board import FAST_P, boards
from .rollout import Trajectory, read_jsonl
from .sweep import RESULTS


def plot(board: dict[str, Any], out: Path) -> list[Path]:
    """fast_p curves and peak_fraction bars as PNGs under `out`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    files = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, row in board["fast_p"].items():
        pts = [(p, row[f"fast_{p:g}"]) for p in FAST_P if row[f"fast_{p:g}"] is not None]
        ax.plot([p for p, _ in pts], [v for _, v in pts], marker="o", label=policy)
    ax.set_xlabel("speedup threshold p")
    ax.set_ylabel("fast_p (share of all tasks)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(-0.1, max(FAST_P) + 0.1)
    ax.set_title("fast_p" + ("" if board["timing_meaningful"] else " (CPU mode: only p=0 is meaningful)"))
    ax.grid(alpha=0.3)
    ax.legend()
    files.append(out / "fast_p.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    problems = sorted({p for rows in board["peak_fraction"].values() for p in rows})
    policies = list(board["peak_fraction"])
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(problems) * max(1, len(policies))), 4))
    width = 0.8 / max(1, len(policies))
    for k, policy in enumerate(policies):
        vals = [(board["peak_fraction"][policy].get(p) or {}).get("geomean") or 0.0 for p in problems]
        ax.bar([i + k * width for i in range(len(problems))], vals, width, label=policy)
    ax.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(problems))], problems)
    ax.set_ylabel("peak_fraction (geomean over correct samples)")
    ax.set_ylim(0, 1)
    ax.set_title("peak_fraction by problem" + ("" if board["timing_meaningful"] else " (CPU mode: none measured)"))
    ax.legend()
    files.append(out / "peak_fraction.png")
    fig.tight_layout()
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)
    return files


def _table(title: str, rows: dict[str, dict[str, Any]]) -> str:
    cols = list(next(iter(rows.values()), {}).keys())
    fmt = lambda v: "-" if v is None else f"{v:.3f}" if isinstance(v, float) else html.escape(str(v))  # noqa: E731
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["policy", *cols])
    body = "".join("<tr><td>" + html.escape(p) + "</td>" + "".join(f"<td>{fmt(r[c])}</td>" for c in cols) + "</tr>"
                   for p, r in rows.items())
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{body}</table>"


def _episodes(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    out = []
    for t in sorted(trajs, key=lambda t: (t.policy, t.task.problem, t.task.seed)):
        out.append({"policy": t.policy, "problem": t.task.problem, "seed": t.task.seed, "error": t.error,
                    "turns": [{"turn": s.turn, "reward": s.reward, "correct": s.info.get("correct"),
                               "error": s.info.get("error"), "speedup": s.info.get("speedup"),
                               "prompt": s.policy_info.get("prompt", ""), "reply": s.policy_info.get("reply", ""),
                               "candidate": s.action, "feedback": s.observation.get("feedback", "")}
                              for s in t.steps]})
    return out


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
#episodes li{cursor:pointer;margin:2px 0}#episodes li:hover{text-decoration:underline}
pre{background:#f6f6f6;padding:8px;overflow:auto;max-height:24em;white-space:pre-wrap}
.turn{border-left:3px solid #888;padding-left:1em;margin:1em 0}.ok{color:#070}.bad{color:#a00}"""

_SCRIPT = """
const episodes = JSON.parse(document.getElementById('episodes-data').textContent);
const list = document.getElementById('episodes'), view = document.getElementById('viewer');
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; if (cls) e.className = cls; return e; }
function show(i) {
  const ep = episodes[i]; view.replaceChildren(el('h3', ep.policy + ' / ' + ep.problem + ' / sample ' + ep.seed));
  if (ep.error) view.appendChild(el('p', 'episode error: ' + ep.error, 'bad'));
  for (const t of ep.turns) {
    const d = el('div', undefined, 'turn');
    d.appendChild(el('h4', 'turn ' + t.turn + ': reward ' + t.reward.toFixed(3) + (t.correct ? ', correct' : ', ' + (t.error || 'flagged')), t.correct ? 'ok' : 'bad'));
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
    peak_rows = {p: {prob: (f"{r['geomean']:.3f}" if r["geomean"] is not None else "-") + f" ({r['correct']}/{r['samples']})"
                     for prob, r in rows.items()} for p, rows in board["peak_fraction"].items()}
    data = json.dumps(_episodes(trajs)).replace("</", "<\\/")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>kb_env sweep: {html.escape(out.name)}</title>
<style>{_STYLE}</style></head><body><h1>kb_env sweep: {html.escape(out.name)}</h1>{note}
{_table("fast_p (KernelBench)", board["fast_p"])}{_table("rates (KernelBench-v3)", board["rates"])}
{_table("peak_fraction (KernelBench-Hard)", peak_rows)}
{"".join(f'<img src="plots/{p.name}" alt="{p.stem}">' for p in pngs)}
<h2>Episodes</h2><ul id="episodes"></ul><div id="viewer"></div>
<script type="application/json" id="episodes-data">{data}</script><script>{_SCRIPT}</script></body></html>"""
    report = out / "report.html"
    report.write_text(page)
    return report
