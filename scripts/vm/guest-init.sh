#!/bin/sh
# PID 1 of the airlock test VM (installed as /usr/libexec/airlock-vm/init; scripts/vm/lib.sh).
#
# Mounts what a Debian host has (proc, sys, devtmpfs, tmpfs /tmp and /run, cgroup2 alone
# at /sys/fs/cgroup with memory, pids and cpu enabled for the root's children, as systemd
# does), brings up lo, runs the command the host wrote to $dir/command as root from /root,
# prints `AIRLOCK_VM_RESULT <token> <status>` and powers off. Never exits: PID 1 exiting
# panics the kernel.
dir=/usr/libexec/airlock-vm
bb=$dir/busybox
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:$dir/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb

power_off() {
  $bb sync
  $bb poweroff -f
  echo o >/proc/sysrq-trigger
  while :; do $bb sleep 60; done
}

fail() {
  echo "airlock-vm init: $*" >&2
  power_off
}

$bb mount -t proc -o nosuid,nodev,noexec proc /proc || fail "mount /proc"
$bb mount -t sysfs -o nosuid,nodev,noexec sysfs /sys || fail "mount /sys"
$bb mount -t devtmpfs -o nosuid,mode=0755 devtmpfs /dev || fail "mount /dev"
exec </dev/console >/dev/console 2>&1
# Modules a Debian host loads on demand (overlayfs, for airlock's minimal root).
for module in $dir/modules/*.ko*; do
  [ -e "$module" ] || continue
  $bb insmod "$module" || fail "insmod $module"
done
$bb mkdir -p /dev/pts /dev/shm
$bb mount -t devpts -o nosuid,noexec,gid=5,mode=0620,ptmxmode=0666 devpts /dev/pts
$bb ln -sf pts/ptmx /dev/ptmx
$bb ln -sf /proc/self/fd /dev/fd
$bb mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm
$bb mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /tmp || fail "mount /tmp"
$bb mount -t tmpfs -o nosuid,nodev,mode=0755 tmpfs /run || fail "mount /run"
# The options systemd mounts cgroup2 with.
$bb mount -t cgroup2 -o nosuid,nodev,noexec,nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup \
  || fail "mount cgroup2"
echo "+memory +pids +cpu" >/sys/fs/cgroup/cgroup.subtree_control || fail "enable cgroup controllers"
$bb hostname airlock-vm
$bb ip link set lo up || fail "bring up lo"
$bb mount -o remount,rw / 2>/dev/null

# shellcheck source=/dev/null
if [ -r $dir/env ]; then . $dir/env; fi
token=$(cat $dir/token)
echo "airlock-vm: $(uname -r), $($bb nproc) CPUs, $(($(sed -n 's/^MemTotal: *\([0-9]*\) kB/\1/p' /proc/meminfo) / 1024)) MiB," \
  "cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
cd /root || fail "cd /root"
/bin/sh $dir/command
status=$?
cd /
echo "AIRLOCK_VM_RESULT $token $status"
power_off
