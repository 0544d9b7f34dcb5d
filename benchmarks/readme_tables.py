"""Refresh the README's benchmark section from benchmarks/results/*.md: python benchmarks/readme_tables.py"""

import re
from pathlib import Path

root = Path(__file__).resolve().parent.parent
readme = (root / "README.md").read_text()
parts = []
sections = [
    (
        "train_e2e",
        "End to end: recd train with its reader, KJT on arrival order vs IKJT clustered",
        "train_e2e.png",
    ),
    (
        "accuracy",
        "Data order and model quality: held-out NE by table order and shuffle",
        "accuracy.png",
    ),
    ("storage", "Storage: log-bus shards and tables (O1, O2)", None),
    ("storage_impressions", "Storage on the impressions profile", None),
    ("reader", "Readers: KJT vs IKJT, clustered vs unclustered (O3, O4), rm1-like", "reader.png"),
    (
        "reader_clickstream",
        "Readers on the clickstream profile (the shape of a real session log)",
        "reader_clickstream.png",
    ),
    (
        "reader_tier",
        "Reader tiers: in-process, DataLoader workers, Ray Data workers",
        "reader_tier.png",
    ),
    (
        "reader_tier_clickstream",
        "Reader tiers on the clickstream profile",
        "reader_tier_clickstream.png",
    ),
    ("trainer", "Trainer: the RM1 ablation (O5-O7)", "trainer.png"),
    ("checkpoint", "Checkpoints", None),
    ("train_recovery", "Failure recovery inside recd train (survivor vs elastic restart)", None),
    (
        "undo_overhead",
        "Failure-free cost of survivor recovery (the trainer benchmark's model)",
        None,
    ),
    ("recovery", "Failure recovery (the standalone driver, recd recover)", None),
    ("etl_faults", "Killed ETL runs: what a reader sees (local engine)", None),
    ("etl_faults_spark", "Killed ETL runs: what a reader sees (Spark engine)", None),
]
for stem, title, png in sections:
    md = root / "benchmarks" / "results" / f"{stem}.md"
    if not md.exists():
        continue
    body = md.read_text().strip()
    body = re.sub(r"^# .*\n+", "", body)
    parts.append(
        f"### {title}\n\n{body}\n"
        + (
            f"\n![{stem}](benchmarks/results/{png})\n"
            if png and (root / "benchmarks/results" / png).exists()
            else ""
        )
    )
block = "<!-- bench:begin -->\n" + "\n".join(parts) + "<!-- bench:end -->"
if "<!-- bench:begin -->" in readme:
    readme = re.sub(
        r"<!-- bench:begin -->.*<!-- bench:end -->", lambda m: block, readme, flags=re.S
    )
else:
    readme = readme.replace("<!-- bench:storage -->\n<!-- bench:reader -->", block)
(root / "README.md").write_text(readme)
