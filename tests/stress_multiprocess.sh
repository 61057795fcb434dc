#!/usr/bin/env bash
# Repeat every multi-process test (pytest -m multiprocess) N times while a CPU hog keeps every
# core busy, then write the tally of each test. Not run by CI (about 2-3 min per round under load).
#
#   tests/stress_multiprocess.sh [N=30] [OUT=reports/ci/stress_multiprocess.json]
#
# Run it where the test dependencies are installed, e.g. after `nox -s tests`:
#   . .nox/tests/bin/activate && tests/stress_multiprocess.sh
# Exit status 0 only if every test passed in every round. CI reruns nothing: a test that
# needs a retry to pass is broken, and this is how to find out before CI does.
set -u
cd "$(dirname "$0")/.."
N=${1:-30}
OUT=${2:-reports/ci/stress_multiprocess.json}
HOGS=$(nproc)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$WORK"' EXIT

for _ in $(seq "$HOGS"); do python3 -c 'while True: pass' & done
echo "stress: $N rounds of \`pytest -m multiprocess\` beside $HOGS busy-loop processes (logs: $WORK)"

export DAPO_REQUIRE_SCALE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 TOKENIZERS_PARALLELISM=false
start=$(date +%s)
for i in $(seq "$N"); do
  t0=$(date +%s)
  python -m pytest -q -m multiprocess -p no:cacheprovider --junitxml="$WORK/round_$i.xml" \
    > "$WORK/round_$i.log" 2>&1
  status=$?
  echo "round $i/$N: exit $status in $(( $(date +%s) - t0 )) s"
  [ "$status" -eq 0 ] || tail -n 60 "$WORK/round_$i.log"
done

python3 - "$WORK" "$N" "$HOGS" "$(( $(date +%s) - start ))" "$OUT" <<'EOF'
import json, os, platform, subprocess, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path

work, n, hogs, seconds, out = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
tally = {}
for i in range(1, n + 1):
    xml = work / f"round_{i}.xml"
    cases = ET.parse(xml).getroot().iter("testcase") if xml.exists() else []
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else (
            "skipped" if case.find("skipped") is not None else "passed")
        tally.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})[outcome] += 1
try:
    import torch
    torch_version = torch.__version__
except ImportError:
    torch_version = None
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
result = {
    "command": f"tests/stress_multiprocess.sh {n}",
    "rounds": n,
    "load": f"{hogs} busy-loop processes on {os.cpu_count()} cores for the whole run",
    "wall_seconds": seconds,
    "date": time.strftime("%Y-%m-%d"),
    "commit": commit,
    "python": platform.python_version(),
    "torch": torch_version,
    "tests": dict(sorted(tally.items())),
    "all_passed": bool(tally) and all(t["passed"] == n for t in tally.values()),
}
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps(result, indent=2) + "\n")
width = max(map(len, tally), default=10)
for name, t in sorted(tally.items()):
    print(f"{name:<{width}}  {t['passed']}/{n}" + (f"  ({t['failed']} failed)" if t["failed"] else ""))
print(f"all passed: {result['all_passed']}  ->  {out}")
sys.exit(0 if result["all_passed"] else 1)
EOF
