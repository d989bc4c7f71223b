#!/bin/bash
# Build the lab's Vagrant box (libvirt, qcow2) from Debian packages and register it with vagrant.
# No box is downloaded: mmdebstrap installs Debian 12 with the generic kernel (the cloud kernel has
# no rdma_rxe), bcc, bird2, rdma-core, perftest and Prometheus from the host's own apt mirror, and
# the project's Python dependencies from wheels fetched on the host (the VMs reach no registry).
#
# No loop devices and no grub-install: the root file system is made with `mkfs.ext4 -d` from the
# installed tree and written into the disk image at 1 MiB; GRUB's boot.img and a core.img made by
# grub-mkimage go in front of it. (Kernels without partition-table support, like this CI's,
# cannot use losetup -P.)
#
#   vagrant/build-box.sh [--name NAME] [--size 6G] [--keep]     # ~4 min, ~1 GiB box
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
name=${RLB_BOX:-rlb/bookworm-lab}
size=6G
keep=
while [ $# -gt 0 ]; do
    case $1 in
        --name) name=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-box: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "build-box: run as root (mmdebstrap, chroot)" >&2; exit 1; }
for tool in mmdebstrap mkfs.ext4 sfdisk grub-mkimage qemu-img vagrant; do
    command -v $tool >/dev/null || { echo "build-box: $tool missing: make vagrant-deps" >&2; exit 1; }
done
pip=$repo/.venv/bin/pip
[ -x "$pip" ] || { echo "build-box: $pip missing: run make setup first (it fetches the wheels)" >&2; exit 1; }

work=$(mktemp -d /var/tmp/rlb-box.XXXXXX)
trap '[ -n "$keep" ] || rm -rf "$work"' EXIT
log() { echo "build-box: $(date +%T) $*"; }

log "wheels for the VMs' venv"
"$pip" download -q --only-binary=:all: -d "$work/wheels" -r "$here/box/requirements.txt"
cp "$here/box/requirements.txt" "$work/wheels/"

mapfile -t mirrors < <(python3 "$here/apt-sources.py")
log "mmdebstrap from: ${mirrors[*]}"
mapfile -t packages < <(grep -v '^#' "$here/box/packages.txt" | tr -s ' ' '\n' | grep .)
IFS=,
mmdebstrap --variant=minbase --components=main --aptopt='APT::Install-Recommends "false"' \
    --include="${packages[*]}" \
    --customize-hook="RLB_WHEELS='$work/wheels' '$here/box/customize.sh' \"\$1\"" \
    bookworm "$work/root" "${mirrors[@]}"
unset IFS

uuid=$(cat /proc/sys/kernel/random/uuid)
kernel=$(cd "$work/root/boot" && ls vmlinuz-* | sort -V | tail -1)
initrd=initrd.img-${kernel#vmlinuz-}
[ -f "$work/root/boot/$initrd" ] || { echo "build-box: no $initrd in the image" >&2; exit 1; }
mkdir -p "$work/root/boot/grub/i386-pc"
cp /usr/lib/grub/i386-pc/*.mod /usr/lib/grub/i386-pc/*.lst "$work/root/boot/grub/i386-pc/"
cat > "$work/root/boot/grub/grub.cfg" <<CFG
set timeout=0
search --no-floppy --fs-uuid --set=root $uuid
linux /boot/$kernel root=UUID=$uuid ro console=ttyS0,115200 net.ifnames=0
initrd /boot/$initrd
boot
CFG
echo "UUID=$uuid / ext4 errors=remount-ro 0 1" > "$work/root/etc/fstab"

log "file system and disk ($size)"
truncate -s "$size" "$work/disk.raw"
bytes=$(stat -c %s "$work/disk.raw")
truncate -s $((bytes - 1048576)) "$work/root.ext4"
mkfs.ext4 -q -F -U "$uuid" -L rlbroot -d "$work/root" "$work/root.ext4"
echo 'label: dos
start=2048, type=83, bootable' | sfdisk -q "$work/disk.raw"
dd if="$work/root.ext4" of="$work/disk.raw" bs=1M seek=1 conv=sparse,notrunc status=none
grub-mkimage -O i386-pc -o "$work/core.img" -p '(hd0,msdos1)/boot/grub' \
    biosdisk part_msdos ext2 search search_fs_uuid
dd if=/usr/lib/grub/i386-pc/boot.img of="$work/disk.raw" bs=440 count=1 conv=notrunc status=none
dd if="$work/core.img" of="$work/disk.raw" bs=512 seek=1 conv=notrunc status=none
rm -f "$work/root.ext4"
qemu-img convert -O qcow2 "$work/disk.raw" "$work/box.img"
rm -f "$work/disk.raw"

log "box $name"
gib=$(( (bytes + 1073741823) / 1073741824 ))
echo "{\"provider\": \"libvirt\", \"format\": \"qcow2\", \"virtual_size\": $gib}" > "$work/metadata.json"
printf 'Vagrant.configure("2") do |config|\nend\n' > "$work/Vagrantfile"
tar -C "$work" -cf "$work/box.tar" metadata.json Vagrantfile box.img
vagrant box add --force --name "$name" "$work/box.tar"
# vagrant-libvirt keeps the base volume it uploaded for the previous box of this name: drop it
if virsh -c qemu:///system pool-info default >/dev/null 2>&1; then
    for vol in $(virsh -c qemu:///system vol-list default | awk -v n="${name//\//-VAGRANTSLASH-}_vagrant_box_image" 'index($1, n) == 1 {print $1}'); do
        virsh -c qemu:///system vol-delete --pool default "$vol" >/dev/null && log "dropped cached volume $vol"
    done
else    # libvirt not running: the default pool's directory is refreshed when it starts
    for vol in /var/lib/libvirt/images/"${name//\//-VAGRANTSLASH-}"_vagrant_box_image_*; do
        [ -e "$vol" ] && rm -f "$vol" && log "dropped cached volume $vol"
    done
fi
log "done: $(du -h "$work/box.img" | cut -f1) image, box $name"
