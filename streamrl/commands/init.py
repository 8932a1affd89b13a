"""`streamrl init DIR`: a project folder with copies of the shipped recipes and the monitoring bundle.

DIR/configs/ gets the recipes (tiny.yaml, paper/, mgrpo/, the Slurm scripts of cluster/, the model shapes of
models/) and DIR/monitoring/ the Prometheus and Grafana files with their compose file, so a user edits their own
copies and runs `streamrl run configs/tiny.yaml` or `docker compose -f monitoring/compose.yml up -d` from DIR.
A file that is already there is never replaced unless asked (`force`): the copy is all or nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from streamrl import resources

FOLDERS = {"configs": resources.recipes_dir, "monitoring": resources.monitoring_dir}


def plan(directory: str | Path) -> list[tuple[Path, Path]]:
    """(shipped file, destination) for every file `init` writes, in order."""
    dest = Path(directory)
    return [(root / rel, dest / name / rel) for name, folder in FOLDERS.items()
            for root in [folder()] for rel in resources.data_files(root)]


def init(directory: str | Path, force: bool = False) -> list[Path]:
    """Copy the shipped files into `directory` (made if missing); the destinations written.

    Raises FileExistsError naming the files already there (nothing is written then) unless `force`."""
    pairs = plan(directory)
    if folders := [d for _, d in pairs if d.is_dir()]:
        raise IsADirectoryError(f"{folders[0]}: a folder where streamrl init writes a file; nothing written")
    if not force and (there := [d for _, d in pairs if d.exists()]):
        shown = ", ".join(str(d) for d in there[:5]) + (f" and {len(there) - 5} more" if len(there) > 5 else "")
        raise FileExistsError(f"{len(there)} of the files to write already exist ({shown}); nothing written. "
                              "Pass --force to replace them, or choose an empty folder")
    for src, dst in pairs:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        if src.suffix in (".sh", ".sbatch") or src.stat().st_mode & 0o111:  # the Slurm scripts stay runnable
            dst.chmod(dst.stat().st_mode | 0o755)
    return [d for _, d in pairs]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("init", help="copy the shipped recipes, Slurm scripts and monitoring bundle into DIR")
    p.add_argument("directory", help="project folder to write (DIR/configs/, DIR/monitoring/; made if missing)")
    p.add_argument("--force", action="store_true", help="replace files already there (default: refuse)")


def main(args: argparse.Namespace) -> int:
    try:
        made = init(args.directory, force=args.force)
    except OSError as e:
        print(f"streamrl init: error: {e}", file=sys.stderr)
        return 2
    print(f"streamrl init: wrote {len(made)} files to {args.directory}/ (configs/, monitoring/); try "
          f"`cd {args.directory} && streamrl run configs/tiny.yaml`")
    return 0
