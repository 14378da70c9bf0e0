#!/usr/bin/env bash
# The Debian packages the `vm` tests need (QEMU under TCG, libvirt for the migration tests,
# socat for the guest forwards, busybox for the guest image, libvirt-dev and pkg-config to build
# libvirt-python), installed when missing: with apt-get as root, or through `sudo -n`.
# Idempotent and silent when everything is present. When nothing can install them it says so
# and exits 0: the vm tests then skip, naming what is missing (tests/vm/conftest.py).
set -euo pipefail

PACKAGES=(qemu-system-x86 libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients
          libvirt-dev pkg-config socat busybox-static)

command -v dpkg-query >/dev/null 2>&1 || {
    echo "vm_deps: not a Debian-based host (no dpkg-query): vm tests will skip" >&2
    exit 0
}
missing=()
for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$p")
done
# The guest image is built from apt's package lists (vm-images/build.py): fetch them when empty.
lists_ok=1
apt-cache policy linux-image-amd64 2>/dev/null | grep -q 'Candidate: [0-9]' || lists_ok=0
[ ${#missing[@]} -eq 0 ] && [ $lists_ok = 1 ] && exit 0

if [ "$(id -u)" = 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "vm_deps: cannot install ${missing[*]:-the package lists} (not root, no" \
         "password-less sudo): vm tests will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get update -qq >/dev/null; then
    echo "vm_deps: apt-get update failed: vm tests will skip or fail to build the image" >&2
    exit 0
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "vm_deps: installing ${missing[*]}" >&2
if ! "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" \
            >/dev/null; then
    echo "vm_deps: apt-get could not install ${missing[*]}: vm tests will skip" >&2
fi
