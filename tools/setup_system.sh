#!/usr/bin/env bash
# Installs the Debian packages FastRL needs when they are missing: Slurm (slurmctld, slurmd,
# client tools), munge, and Open MPI (runtime and headers, used by mpi4py).
# Idempotent and quiet when everything is present; skipped with a message when not root.
set -euo pipefail
packages=(slurm-wlm slurm-client munge openmpi-bin libopenmpi-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "setup: not root, skipping system packages: ${missing[*]} (Slurm/MPI tests will fail without them;" >&2
  echo "setup: install them with: sudo apt-get install -y ${missing[*]})" >&2
  exit 0
fi
echo "setup: installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: system packages installed"
