"""Open a sweep's HTML report in headless Chromium and check it works offline: every table is
there, every plot loads, the page raises no script error and asks for nothing over the network,
and the transcript viewer shows an episode's turns (its prompt, reply, candidate and feedback).
Takes a full-page screenshot.

    python scripts/check_report.py RUN_DIR [--screenshot report.png] [--chromium /usr/bin/chromium]

RUN_DIR is a `kb sweep --out` folder (the report is written first if it is missing). Needs
playwright-python (`pip install 'kb_env[browser]'`) and a Chromium binary: Debian's
(`apt-get install chromium`) is used as is, playwright never downloads one. Exits 1 and says what
failed when a check fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def find_chromium() -> str | None:
    """A Chromium binary on this machine, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def check_report(run_dir: Path, screenshot: Path, chromium: str | None = None) -> dict[str, Any]:
    """Render `run_dir/report.html`, screenshot it, open the viewer on the episode with the most
    turns; returns what was seen, with `failures` (empty when every check passed)."""
    from playwright.sync_api import sync_playwright

    run_dir = Path(run_dir)
    report = run_dir / "report.html"
    if not report.exists():
        from kb_env.report import write_report

        write_report(run_dir)
    chromium = chromium or find_chromium()
    if chromium is None:
        raise FileNotFoundError("no Chromium binary found (apt-get install chromium)")
    page_text = report.read_text()
    episodes = json.loads(page_text.split('id="episodes-data">')[1].split("</script>")[0].replace("<\\/", "</"))
    failures: list[str] = []
    errors: list[str] = []
    remote: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kb-chromium-") as profile, sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True,
                                                    args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 900})
        try:
            page = ctx.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("request", lambda req: None if req.url.startswith(("file:", "data:", "about:"))
                    else remote.append(req.url))
            page.goto(report.as_uri(), wait_until="load")
            titles = page.locator("h2").all_inner_texts()
            tables = page.locator("table").count()
            images = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])")
            broken = [src for src, width in images if not width]
            listed = page.locator("#episodes li").count()
            seen: dict[str, Any] = {}
            if episodes:
                index = max(range(len(episodes)), key=lambda i: len(episodes[i]["turns"]))
                ep = episodes[index]
                page.click(f"#ep-{index}")
                page.wait_for_selector("#viewer h3")
                heading = page.inner_text("#viewer h3")
                turns = page.locator("#viewer .turn h4").all_inner_texts()
                page.locator("#viewer .turn summary").first.click()  # open the first turn's first section
                seen = {"episode": heading, "turns": turns,
                        "sections": page.locator("#viewer .turn summary").all_inner_texts(),
                        "open_text": page.locator("#viewer .turn details[open] pre").first.inner_text()[:200]}
                if heading != f"{ep['policy']} / {ep['problem']} / sample {ep['seed']}":
                    failures.append(f"the viewer shows {heading!r}, not the episode clicked")
                if [t.split(":")[0] for t in turns] != [f"turn {t['turn']}" for t in ep["turns"]]:
                    failures.append(f"the viewer shows turns {turns}, the episode has {len(ep['turns'])}")
                if not seen["sections"] or not seen["open_text"].strip():
                    failures.append("the viewer's turn sections are empty")
            page.screenshot(path=str(screenshot), full_page=True)
        finally:
            ctx.close()
    if errors:
        failures.append(f"script errors: {errors}")
    if remote:
        failures.append(f"the report reached beyond the file system: {remote[:3]}")
    if broken or not images:
        failures.append(f"plots that did not load: {broken or 'no <img> at all'}")
    if listed != len(episodes):
        failures.append(f"{listed} episodes listed, {len(episodes)} in the data")
    expected = page_text.count("<table>")
    if tables != expected or tables < 4:
        failures.append(f"{tables} tables rendered, {expected} in the page")
    return {"titles": titles, "tables": tables, "images": images, "episodes": listed, "viewer": seen,
            "screenshot": str(screenshot), "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--screenshot", type=Path, help="default: RUN_DIR/report.png")
    ap.add_argument("--chromium", help="the Chromium binary (default: found on PATH)")
    args = ap.parse_args()
    out = check_report(args.run_dir, args.screenshot or args.run_dir / "report.png", args.chromium)
    print(f"tables: {out['tables']}  plots: {len(out['images'])}  episodes listed: {out['episodes']}")
    print(f"viewer: {out['viewer'].get('episode')}: {len(out['viewer'].get('turns', []))} turn(s)")
    for line in out["viewer"].get("turns", []):
        print(f"  {line}")
    print(f"screenshot: {out['screenshot']}")
    for f in out["failures"]:
        print(f"FAIL: {f}")
    print("report OK" if not out["failures"] else f"{len(out['failures'])} check(s) failed")
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
