#!/usr/bin/env bash
# Download the wheels bench/gpu_check.sh installs on the GPU check machine (no package index there)
# into shared/wheels: cp312 / manylinux x86_64 builds of bench/gpu_wheels.txt, no dependencies
# (the list is complete for that machine). A release published only as an sdist (the ANTLR
# runtime) is built into its pure-Python wheel here. Prints the total size (must stay < 60 MiB).
#
#   tools/fetch_gpu_wheels.sh            # -> shared/wheels/*.whl
#   WHEELS_DIR=/elsewhere tools/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REQS=bench/gpu_wheels.txt
DEST=${WHEELS_DIR:-shared/wheels}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$DEST"
# keep the wheels out of commits (shared/ travels to the device machine, it is not source)
if [ -d .git/info ] && ! grep -qxF '/shared/wheels/' .git/info/exclude 2>/dev/null; then
    echo '/shared/wheels/' >> .git/info/exclude
fi
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
grep -vE '^\s*(#|$)' "$REQS" | while read -r spec; do
    if "$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" --no-deps -d "$DEST" "$spec" 2>/dev/null; then
        continue
    fi
    echo "fetch_gpu_wheels: no wheel for $spec; building it from its sdist (must be pure Python)"
    "$PY" -m pip wheel -q --no-deps --no-binary=:all: -w "$DEST" "$spec"
done
# every listed package has exactly one wheel, and compiled ones are cp312 / manylinux x86_64
"$PY" - "$REQS" "$DEST" <<'PYEOF'
import re, sys
from pathlib import Path
reqs, dest = Path(sys.argv[1]), Path(sys.argv[2])
names = [re.split(r"[=<>!~ ]", l.strip())[0] for l in reqs.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
wheels = sorted(dest.glob("*.whl"))
bad = []
for name in names:
    found = [w for w in wheels if norm(w.name.split("-")[0]) == norm(name)]
    if len(found) != 1:
        bad.append(f"{name}: {len(found)} wheels")
    for w in found:
        tags = w.stem.split("-")[-3:]
        python, abi, platform = tags
        for_312 = python in ("cp312", "py3") or (abi == "abi3" and python.startswith("cp3") and int(python[3:]) <= 12)
        if not for_312 or not (platform == "any" or "x86_64" in platform):
            bad.append(f"{w.name}: not for cp312 / x86_64")
total = sum(w.stat().st_size for w in wheels)
for w in wheels:
    print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
print(f"fetch_gpu_wheels: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}")
if total >= 60 * 2**20:
    bad.append(f"total {total / 2**20:.1f} MiB >= 60 MiB")
if bad:
    sys.exit("fetch_gpu_wheels: " + "; ".join(bad))
PYEOF
