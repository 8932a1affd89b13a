#!/usr/bin/env bash
# The wheel works on its own (issue 30): build it, install it into a clean venv (torch==2.13.0 first), and from
# an empty folder, far from this checkout, run what a new user runs first. Every file the code reads at run time
# (recipes, Slurm scripts, model shapes, the monitoring bundle) must come from the installed package.
#   .ci/wheel_check.sh            (called by .ci/run; needs python3 and the package index)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# One DeepSpeed extension cache per venv (see .ci/run).
export TORCH_EXTENSIONS_DIR="$HOME/.cache/torch_extensions/streamrl-wheel-check"
step() { printf '\n== wheel check: %s\n' "$*"; }

step "build"
python3 -m pip wheel -q --no-deps -w "$work/dist" .
wheel=$(ls "$work"/dist/streamrl-*.whl)
python3 - "$wheel" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["streamrl/py.typed", "streamrl/configs/tiny.yaml", "streamrl/configs/paper/corpo.yaml",
        "streamrl/configs/cluster/submit.sh", "streamrl/configs/models/Qwen3-8B/config.json",
        "streamrl/monitoring/compose.yml", "streamrl/monitoring/grafana/dashboards/streamrl.json",
        "streamrl/actors/main.py", "streamrl/learner/main.py"]
missing = [n for n in need if n not in names]
missing += [] if any(n.endswith(".dist-info/licenses/LICENSE") for n in names) else ["*.dist-info/licenses/LICENSE"]
top = sorted({n.split("/")[0] for n in names} - {"streamrl"} - {n.split("/")[0] for n in names if ".dist-info" in n})
assert not missing and not top, f"wheel lacks {missing}; stray top-level entries {top}"
print(f"{sys.argv[1].rsplit('/', 1)[-1]}: {len(names)} files, nothing missing")
EOF

step "install into a clean venv"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q torch==2.13.0
"$work/venv/bin/pip" install -q "$wheel"
export PATH="$work/venv/bin:$PATH"
mkdir "$work/empty" && cd "$work/empty"
python -c "import streamrl, sys; assert streamrl.__file__.startswith('$work/venv/'), streamrl.__file__; print(streamrl.__file__)"

step "streamrl check"  # before the run: check refuses a run name that already holds results
streamrl check >/dev/null
step "streamrl run steps=5"
streamrl run steps=5
test -s runs/tiny/metrics.jsonl
step "streamrl plan"
streamrl plan
step "streamrl plan model.path=Qwen/Qwen3-8B (the shipped shape)"
streamrl plan model.path=Qwen/Qwen3-8B | tee "$work/plan.txt"
grep -q "site-packages/streamrl/configs/models/Qwen3-8B/config.json" "$work/plan.txt"
step "streamrl difficulty (--help, and a short real pass on the default recipe)"
streamrl difficulty --help >/dev/null
streamrl difficulty --out kept.jsonl --prompts 4 --rollouts 2
test -f kept.jsonl
step "shipped recipes by name"
streamrl check mgrpo/tiny.yaml >/dev/null
streamrl plan paper/corpo.yaml > "$work/plan-paper.txt"
grep -q "site-packages/streamrl/configs/models/Qwen3-8B/config.json" "$work/plan-paper.txt"
step "streamrl init project"
streamrl init project
test -f project/configs/tiny.yaml -a -x project/configs/cluster/submit.sh -a -f project/monitoring/compose.yml
if streamrl init project 2>/dev/null; then echo "streamrl init overwrote an existing project" >&2; exit 1; fi
(cd project && streamrl check configs/mgrpo/tiny.yaml >/dev/null)
step "passed"
