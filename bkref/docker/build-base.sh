#!/bin/sh
# Build the node base image's root filesystem from Debian's mirror, as a tarball
# for `docker import` (no image registry is reachable here).
#   build-base.sh OUT.tar MIRROR PACKAGE...
# debootstrap --variant=minbase, then the packages installed in a chroot; apt's
# lists and caches are dropped so the image stays small.
set -eu
out=$1; mirror=$2; shift 2
root=$(mktemp -d "${TMPDIR:-/tmp}/bkref-rootfs.XXXXXX")
cleanup() {
    for m in dev/pts proc; do umount "$root/$m" 2>/dev/null || true; done
    rm -rf "$root"
}
trap cleanup EXIT INT TERM
debootstrap --variant=minbase bookworm "$root" "$mirror"
mount -t proc proc "$root/proc"
mount --bind /dev/pts "$root/dev/pts"
# JRE's postinst needs /proc; policy-rc.d keeps packages from starting services.
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
mkdir -p "$root/usr/share/man/man1"
chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root/usr/sbin/policy-rc.d"
umount "$root/dev/pts" "$root/proc"
tar -C "$root" -cf "$out.part" --numeric-owner .
mv "$out.part" "$out"
