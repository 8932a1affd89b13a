#!/usr/bin/env bash
# The GPU checks (issue 28, item 4) on a machine with CUDA, torch and transformers: tests/gpu as far as
# the installed packages allow, then the learner and hf actors on the GPU with the release-shaped Qwen3
# folder, strict in bf16, once over ZeroMQ and once over the collective (NCCL) weight sync, which on one
# GPU must fall back to ZeroMQ. A machine without a package index gets the missing packages as wheels
# in .whl/ (docs/guides/gpu-readiness.md says which). Writes its logs and run records under $OUT (default build/gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { cat "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, deepspeed; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | grep -v WARNING

echo "== tests/gpu"
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/tests-gpu.log" | tail -25
echo "== the strict self-check with the learner on the GPU and the actor model on the CPU"
python3 -m pytest -q -s -p no:cacheprovider tests/integration/test_strict_check.py 2>&1 | tee "$OUT/strict-check.log" \
  | grep -E "passed|failed|fired|Error|^(float32|bfloat16)" | tail -12

echo "== the release-shaped folder, learner and two hf actors on the GPU, strict, bf16"
REL=$(python3 -c "from streamrl.models import release_model; print(release_model.build('$OUT/qwen3-shaped'))")
run() {  # NAME, extra overrides...
  local name=$1; shift
  local t0=$SECONDS
  python3 -m streamrl run "model.path=$REL" on_policy=strict model.dtype=bfloat16 steps=6 learner.batch_groups=4 \
    actors.num=2 actors.backend=hf "name=$name" "run_dir=$OUT/runs" monitoring.learner_port=0 monitoring.actor_port=0 \
    "$@" >"$OUT/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s"
  grep -A30 Traceback "$OUT/runs/$name/logs/learner.log" 2>/dev/null | tail -30
  tail -4 "$OUT/$name.log"
  python3 - "$OUT/runs/$name" <<'EOF'
import json, sys
from pathlib import Path
run = Path(sys.argv[1])
for line in (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").exists() else []:
    r = json.loads(line)
    print({k: r.get(k) for k in ("step", "lag_max", "optimizer_steps", "is_ratio_max_abs_dev", "strict_kl_max",
                                 "reward_mean", "weight_sync", "step_s")})
s = run / "summary.json"
print("summary:", {k: v for k, v in json.loads(s.read_text()).items() if k in ("status", "groups_used", "error")}
      if s.exists() else "none")
for log in sorted((run / "logs").glob("*.log")) if (run / "logs").exists() else []:
    text = log.read_text()
    hits = [l for l in text.splitlines() if "cuda" in l.lower() or "nccl" in l.lower() or "fall" in l.lower()]
    print(f"-- {log.name}: {len(text.splitlines())} lines;", *hits[-4:], sep="\n   ")
EOF
}
run gpu-strict-zmq
run gpu-strict-collective transport.weight_sync=collective
tar -C "$OUT" -czf "$OUT/runs.tgz" runs 2>/dev/null && rm -rf "$OUT/runs" "$OUT/qwen3-shaped"
