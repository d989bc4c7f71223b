#!/bin/bash
# mmdebstrap customize hook: turn the installed tree ($1) into a Vagrant box. Runs on the host.
set -euo pipefail
root=$1
inroot() { chroot "$root" "$@"; }

# the vagrant user with Vagrant's well-known insecure key (vagrant replaces it on first up)
inroot useradd -m -s /bin/bash -G sudo vagrant
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' > "$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
install -d -m 700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
pub=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub | head -1)
install -m 600 -o 1000 -g 1000 "$pub" "$root/home/vagrant/.ssh/authorized_keys"
echo 'UseDNS no' > "$root/etc/ssh/sshd_config.d/vagrant.conf"

# every VM gets its own ssh host keys and machine id on first boot
rm -f "$root"/etc/ssh/ssh_host_*
cat > "$root/etc/systemd/system/ssh-hostkeys.service" <<'UNIT'
[Unit]
Description=Generate ssh host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A
[Install]
WantedBy=multi-user.target
UNIT
inroot systemctl enable ssh-hostkeys.service
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"

# ifupdown, as Vagrant's Debian guest support expects (no networkd, no netplan)
cat > "$root/etc/network/interfaces" <<'NET'
auto lo
iface lo inet loopback

allow-hotplug eth0
iface eth0 inet dhcp
NET
echo rlb > "$root/etc/hostname"
printf "127.0.0.1 localhost\n127.0.1.1 rlb\n::1 localhost ip6-localhost ip6-loopback\n" > "$root/etc/hosts"
echo 'LANG=C.UTF-8' > "$root/etc/default/locale"

# nothing starts that the lab did not ask for, and no periodic jobs eat the emulated CPU
inroot systemctl mask bird.service prometheus.service apt-daily.timer apt-daily-upgrade.timer \
    man-db.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true

# the project's Python dependencies, for a venv that sees Debian's bcc
mkdir -p "$root/opt/rlb"
cp -r "$RLB_WHEELS" "$root/opt/rlb/wheels"
inroot /usr/bin/python3 -m venv --system-site-packages /opt/rlb/venv
inroot /opt/rlb/venv/bin/pip install -q --upgrade --no-index --find-links /opt/rlb/wheels \
    -r /opt/rlb/wheels/requirements.txt
inroot apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/tmp/*
