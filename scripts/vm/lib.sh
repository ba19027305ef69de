# shellcheck shell=bash
# Shared by vm-run.sh and run-v2-tests.sh: a small cgroup v2 VM under qemu (TCG) that boots
# Debian's cloud kernel straight from an ext4 image holding a copy of this host's Python,
# coreutils and libraries plus the files a run asks for, runs one command as root, prints
# its output and reports its exit status. Sourced, never run; set -euo pipefail is the
# caller's. See scripts/vm/README.md.

# Where kernels, the base tree and per-run images live (outside the clone).
VM_CACHE="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/vm"
# The kernel package; empty: the version linux-image-cloud-amd64 depends on.
VM_KERNEL_PACKAGE="${AIRLOCK_VM_KERNEL_PACKAGE:-}"
# Guest size. 2 GiB: a test allocates 1 GiB behind a 256 MiB limit; the kernel's OOM
# killer must act inside the job's cgroup, never for the whole VM.
VM_MEMORY_MIB="${AIRLOCK_VM_MEMORY_MIB:-2048}"
VM_CPUS="${AIRLOCK_VM_CPUS:-2}"
# The emulated CPU (qemu -cpu): everything TCG offers but ERMS. With ERMS the guest kernel
# clears pages and glibc sets memory with `rep stosb`, which TCG runs a byte at a time:
# writing 256 MiB took 4.5 s with `max` and 0.5 to 0.9 s without ERMS.
VM_CPU_MODEL="${AIRLOCK_VM_CPU_MODEL:-max,-erms}"
# Host-side bound on one boot, in seconds.
VM_TIMEOUT_S="${AIRLOCK_VM_TIMEOUT_S:-1200}"

# The host's Python (3.11 on Debian 12): the jobs of the tests are Python.
VM_PYTHON=$(python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])' 2>/dev/null || echo python3.11)
# Debian packages copied into the guest's /usr, file by file (docs, man pages and
# translations left out). Merged-/usr, like the host.
VM_BASE_PACKAGES=(libc6 libc-bin libgcc-s1 dash coreutils
  "$VM_PYTHON-minimal" "lib$VM_PYTHON-minimal" "lib$VM_PYTHON-stdlib" "$VM_PYTHON"
  python3-minimal python3)
# Host programs copied with the libraries they link (for debugging and rootless runs).
VM_BASE_PROGRAMS=(/usr/bin/setpriv /usr/bin/ldd /usr/bin/getent)
# Where the guest's own tools go: the init script, busybox and its applets (last in PATH).
VM_GUEST_DIR=/usr/libexec/airlock-vm
# Bump when the layout of the base tree changes, so cached trees are rebuilt.
VM_BASE_LAYOUT=3

vm_log() { printf '==> vm: %s\n' "$*" >&2; }
vm_die() { printf 'vm: error: %s\n' "$*" >&2; exit 1; }

# Seconds since the epoch with milliseconds, for the step timings.
vm_now() { date +%s.%N | cut -c1-14; }
vm_since() { awk -v a="$1" -v b="$(vm_now)" 'BEGIN { printf "%.1f", b - a }'; }

# Installs the host tools: qemu (TCG only; KVM guests hang on this kind of machine),
# busybox (the guest's mount, ip and poweroff), e2fsprogs (mke2fs -d).
vm_install_host_tools() {
  local need=() p
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [ -x /bin/busybox ] || need+=(busybox-static)
  command -v mke2fs >/dev/null || need+=(e2fsprogs)
  command -v flock >/dev/null || need+=(util-linux)
  for p in "${VM_BASE_PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q ' installed$' || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  vm_log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# Sets VM_KERNEL (vmlinuz path) and VM_KERNEL_VERSION, downloading and unpacking the
# Debian cloud kernel package once into $VM_CACHE/kernel-<version>/.
vm_ensure_kernel() {
  local pkg="$VM_KERNEL_PACKAGE" dir deb
  if [ -z "$pkg" ]; then
    # Reuse a cached kernel when there is one: no network, same kernel run after run.
    dir=$(find "$VM_CACHE" -maxdepth 1 -name 'kernel-*' -type d 2>/dev/null | sort -V | tail -1)
    if [ -n "$dir" ] && [ -f "$dir/.complete" ]; then
      VM_KERNEL=$(echo "$dir"/boot/vmlinuz-*)
      VM_KERNEL_VERSION=${VM_KERNEL##*/vmlinuz-}
      vm_ensure_modules "$dir"
      return 0
    fi
    pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    if [ -z "$pkg" ]; then
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    fi
    [ -n "$pkg" ] || vm_die "no linux-image-cloud-amd64 in the apt lists"
  fi
  dir="$VM_CACHE/kernel-${pkg#linux-image-}"
  if [ ! -f "$dir/.complete" ]; then
    vm_log "downloading $pkg"
    rm -rf "$dir" "$dir.tmp"
    mkdir -p "$dir.tmp/deb"
    # apt-get download writes into the current directory; _apt cannot write there as root's
    # cache dir, which only costs a warning.
    (cd "$dir.tmp/deb" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) || true
    deb=$(echo "$dir.tmp"/deb/*.deb)
    [ -f "$deb" ] || vm_die "apt-get download $pkg failed"
    # The kernel image and its config; vm_ensure_modules takes the few modules the guest
    # loads from the package, kept in deb/ (NVMe and ext4 are built in).
    dpkg-deb --fsys-tarfile "$deb" | tar -C "$dir.tmp" -x --wildcards './boot/vmlinuz-*' './boot/config-*'
    mv "$dir.tmp" "$dir"
    touch "$dir/.complete"
  fi
  VM_KERNEL=$(echo "$dir"/boot/vmlinuz-*)
  [ -f "$VM_KERNEL" ] || vm_die "no vmlinuz in $dir"
  VM_KERNEL_VERSION=${VM_KERNEL##*/vmlinuz-}
  local config="$dir/boot/config-$VM_KERNEL_VERSION" opt
  for opt in CONFIG_BLK_DEV_NVME=y CONFIG_EXT4_FS=y CONFIG_DEVTMPFS=y CONFIG_MEMCG=y \
    CONFIG_CGROUP_PIDS=y CONFIG_CFS_BANDWIDTH=y CONFIG_USER_NS=y CONFIG_SERIAL_8250_CONSOLE=y; do
    grep -qx "$opt" "$config" || vm_die "$VM_KERNEL_VERSION lacks $opt: the VM boots without modules"
  done
  vm_ensure_modules "$dir"
}

# The modules the guest loads at boot (guest-init.sh), from the kernel package kept in
# $1/deb: overlayfs, which airlock's minimal root mounts per job and which Debian builds
# as a module. Sets VM_MODULES (a directory of .ko files, possibly empty).
vm_ensure_modules() {
  local dir=$1 deb
  VM_MODULES="$dir/modules"
  [ -f "$VM_MODULES/.complete" ] && return 0
  rm -rf "$VM_MODULES" "$VM_MODULES.tmp"
  mkdir -p "$VM_MODULES.tmp"
  if ! grep -qx 'CONFIG_OVERLAY_FS=y' "$dir"/boot/config-*; then
    deb=$(echo "$dir"/deb/*.deb)
    [ -f "$deb" ] || vm_die "no kernel package in $dir/deb to take overlay.ko from (remove $dir to download it again)"
    dpkg-deb --fsys-tarfile "$deb" | tar -C "$VM_MODULES.tmp" -x --wildcards --no-anchored 'overlay.ko*'
    find "$VM_MODULES.tmp" -name 'overlay.ko*' -type f -exec mv {} "$VM_MODULES.tmp/" \;
    find "$VM_MODULES.tmp" -mindepth 1 -type d -exec rm -rf {} +
    [ -n "$(ls "$VM_MODULES.tmp")" ] || vm_die "no overlay.ko in $deb"
  fi
  mv "$VM_MODULES.tmp" "$VM_MODULES"
  touch "$VM_MODULES/.complete"
}

# Top-level directories that are symlinks into /usr on this (merged-/usr) host.
vm_usr_links() {
  local d
  for d in bin sbin lib lib32 lib64 libx32; do
    [ -L "/$d" ] && [ "$(readlink "/$d")" = "usr/$d" ] && echo "$d"
  done
  return 0
}

# Reads absolute host paths on stdin and prints them with /bin, /lib, ... rewritten to
# their /usr place, so that copying never replaces the guest's top-level symlinks.
vm_canonical_paths() {
  local script="" d
  for d in $(vm_usr_links); do script+="s#^/$d/#/usr/$d/#;"; done
  sed -e "${script:-}"
}

# Prints the libraries (and the loader) that the ELF files named on stdin load, each as
# its canonical path and, for a symlink, also its target.
vm_library_closure() {
  local f lib
  while IFS= read -r f; do
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' || true
  done | vm_canonical_paths | sort -u | while IFS= read -r lib; do
    echo "$lib"
    if [ -L "$lib" ]; then readlink -f "$lib"; fi
  done | sort -u
}

# Copies the host paths listed on stdin (absolute; directories without their content)
# into the tree $1, keeping modes, owners and symlinks.
vm_copy_paths() {
  local tree=$1
  sed 's#^/##' | tar -C / --no-recursion -cf - -T - | tar -C "$tree" -xpf -
}

# Builds the cached base tree: a merged-/usr Debian root with Python, coreutils, dash, the
# libraries they load, busybox and the guest init. Sets VM_BASE.
vm_ensure_base() {
  local script_dir key
  script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  key=$( {
    echo "layout $VM_BASE_LAYOUT"
    dpkg-query -W "${VM_BASE_PACKAGES[@]}"
    sha256sum /bin/busybox "$script_dir/guest-init.sh"
  } | sha256sum | cut -c1-16)
  VM_BASE="$VM_CACHE/base-$key"
  [ -f "$VM_BASE/.complete" ] && return 0
  local started tmp="$VM_BASE.tmp" d
  started=$(vm_now)
  vm_log "building the guest base tree $VM_BASE"
  rm -rf "$tmp"
  mkdir -p "$tmp"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc,proc,sys,dev,tmp,run,root,home,mnt,var/tmp,var/lib}
  chmod 1777 "$tmp/tmp" "$tmp/var/tmp"
  chmod 700 "$tmp/root"
  for d in $(vm_usr_links); do
    mkdir -p "$tmp/usr/$d"
    ln -s "usr/$d" "$tmp/$d"
  done
  # 1. The packages' files (dpkg -L lists directories too; they are created as listed).
  dpkg -L "${VM_BASE_PACKAGES[@]}" \
    | grep -Ev '^/usr/share/(doc|man|info|locale|lintian|bug)(/|$)' \
    | grep '^/.' | vm_canonical_paths | sort -u \
    | while IFS= read -r p; do if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi; done \
    | vm_copy_paths "$tmp"
  # 2. Python's stdlib in full: dpkg -L does not list the __pycache__ made at install,
  #    and without them every interpreter start compiles (slow under emulation).
  tar -C / -cf - "usr/lib/$VM_PYTHON" | tar -C "$tmp" -xpf -
  # 3. More programs, and the libraries of everything copied so far.
  printf '%s\n' "${VM_BASE_PROGRAMS[@]}" | while IFS= read -r p; do if [ -e "$p" ]; then echo "$p"; fi; done \
    | vm_copy_paths "$tmp"
  find "$tmp/usr" -type f \( -perm -u+x -o -name '*.so*' \) \
    | sed "s#^$tmp##" | sed "s#^#/#; s#^//#/#" | vm_library_closure | vm_copy_paths "$tmp"
  # 4. /etc: users (root, nobody and an unprivileged `tester` for rootless runs), the
  #    loader's cache for this tree, and what airlock's sandbox shows of the host's /etc.
  cat >"$tmp/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
tester:x:1000:1000:unprivileged test user:/home/tester:/bin/sh
EOF
  cat >"$tmp/etc/group" <<'EOF'
root:x:0:
tty:x:5:
nogroup:x:65534:
tester:x:1000:
EOF
  printf 'root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\ntester:*:19000:0:99999:7:::\n' >"$tmp/etc/shadow"
  chmod 640 "$tmp/etc/shadow"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tairlock-vm\n' >"$tmp/etc/hosts"
  echo airlock-vm >"$tmp/etc/hostname"
  printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n' >"$tmp/etc/nsswitch.conf"
  : >"$tmp/etc/resolv.conf"
  ln -s ../proc/self/mounts "$tmp/etc/mtab"
  mkdir -p "$tmp/home/tester"
  chown 1000:1000 "$tmp/home/tester"
  for d in /etc/ld.so.conf /etc/ld.so.conf.d /etc/alternatives /etc/ssl /usr/share/ca-certificates; do
    [ -e "$d" ] && tar -C / -cf - "${d#/}" | tar -C "$tmp" -xpf -
  done
  ldconfig -r "$tmp"
  # 5. The guest's own tools: busybox with its applets in a directory last in PATH (the
  #    Debian programs above win), and PID 1.
  mkdir -p "$tmp$VM_GUEST_DIR/bin"
  cp /bin/busybox "$tmp$VM_GUEST_DIR/busybox"
  for d in $(/bin/busybox --list); do
    ln -s ../busybox "$tmp$VM_GUEST_DIR/bin/$d"
  done
  install -m 755 "$script_dir/guest-init.sh" "$tmp$VM_GUEST_DIR/init"
  # The console PID 1 gets before it mounts devtmpfs.
  mknod -m 600 "$tmp/dev/console" c 5 1
  mknod -m 666 "$tmp/dev/null" c 1 3
  rm -rf "$VM_BASE"
  mv "$tmp" "$VM_BASE"
  touch "$VM_BASE/.complete"
  # Trees of older layouts or package versions are not used again.
  find "$VM_CACHE" -maxdepth 1 -name 'base-*' ! -name "base-$key" -exec rm -rf {} +
  vm_log "base tree ready ($(du -sm "$VM_BASE" | cut -f1) MiB) in $(vm_since "$started") s"
}

# Builds the run's image $1 from the base tree, the host paths in the array VM_WITH (same
# absolute paths in the guest; directories with their content) and their libraries, the
# command $2 and the environment assignments in the array VM_ENV.
vm_build_image() {
  local image=$1 command=$2 stage size_mib started p
  started=$(vm_now)
  stage="$(dirname "$image")/stage"
  rm -rf "$stage"
  # Hard links: instant, and the base tree is never written through them (mke2fs only reads).
  cp -al "$VM_BASE" "$stage"
  rm -f "$stage/.complete"
  for p in "${VM_WITH[@]}"; do
    [ -e "$p" ] || vm_die "--with $p: no such file or directory"
    p=$(realpath -s "$p")
    case "$p" in /|/proc*|/sys*|/dev*|/usr|/usr/*) vm_die "--with $p: not allowed (the guest has its own)";; esac
    mkdir -p "$stage$(dirname "$p")"
    # A fresh copy, never a hard link into the host's file.
    rm -rf "${stage:?}$p"
    cp -a "$p" "$stage$p"
  done
  if [ ${#VM_WITH[@]} -gt 0 ]; then
    find "${VM_WITH[@]}" -type f -perm -u+x 2>/dev/null | vm_library_closure \
      | while IFS= read -r p; do if [ ! -e "$stage$p" ]; then echo "$p"; fi; done | vm_copy_paths "$stage"
  fi
  mkdir -p "$stage$VM_GUEST_DIR/modules"
  find "$VM_MODULES" -maxdepth 1 -name '*.ko*' -exec cp {} "$stage$VM_GUEST_DIR/modules/" \;
  printf '%s\n' "$command" >"$stage$VM_GUEST_DIR/command"
  {
    for p in "${VM_ENV[@]}"; do
      printf 'export %q\n' "$p"
    done
  } >"$stage$VM_GUEST_DIR/env"
  printf '%s\n' "$VM_TOKEN" >"$stage$VM_GUEST_DIR/token"
  size_mib=$(( $(du -sm "$stage" | cut -f1) * 5 / 4 + 256 ))
  rm -f "$image"
  mke2fs -q -F -t ext4 -m 0 -L airlock-vm -d "$stage" "$image" "${size_mib}M"
  rm -rf "$stage"
  vm_log "image $image (${size_mib} MiB, sparse) built in $(vm_since "$started") s"
}

# Boots the image $1 and copies the serial console to stdout and to $2. Returns the
# guest command's exit status; 124 when the boot outlived VM_TIMEOUT_S; 125 when the guest
# never reported a status (a failed boot: read $2).
vm_boot() {
  local image=$1 log=$2 append started status line
  append="console=ttyS0 root=/dev/nvme0n1 rootfstype=ext4 rootwait rw init=$VM_GUEST_DIR/init"
  # Pure cgroup v2: no v1 hierarchy can be mounted. panic=-1 with -no-reboot turns a
  # kernel panic (PID 1 exiting, a root that does not mount) into qemu exiting.
  append+=" cgroup_no_v1=all panic=-1 sysrq_always_enabled=1"
  if [ "${VM_VERBOSE:-0}" = 1 ]; then append+=" loglevel=7"; else append+=" quiet loglevel=3"; fi
  started=$(vm_now)
  vm_log "booting $VM_KERNEL_VERSION: $VM_CPUS vCPUs, $VM_MEMORY_MIB MiB, TCG (timeout ${VM_TIMEOUT_S} s)"
  set +e
  # KVM guests hang on this kind of machine: software emulation only. stdin is closed
  # (CI has none), the console goes through a pipe; sed drops the firmware's terminal
  # escapes and the serial line's carriage returns.
  timeout --foreground -k 10 "$VM_TIMEOUT_S" qemu-system-x86_64 \
    -accel tcg -M q35 -cpu "$VM_CPU_MODEL" -smp "$VM_CPUS" -m "$VM_MEMORY_MIB" \
    -nodefaults -no-user-config -display none -no-reboot \
    -chardev stdio,id=console,signal=off -serial chardev:console \
    -kernel "$VM_KERNEL" -append "$append" \
    -drive "file=$image,if=none,id=root,format=raw,cache=unsafe" \
    -device nvme,drive=root,serial=airlock-root \
    </dev/null 2>&1 \
    | sed -u -E 's/\x1b(\[[0-9;?]*[A-Za-z]|c)//g; s/\r$//' | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  vm_log "VM ran for $(vm_since "$started") s (qemu exit $status)"
  if [ "$status" = 124 ]; then
    echo "vm: the VM did not finish within ${VM_TIMEOUT_S} s (AIRLOCK_VM_TIMEOUT_S)" >&2
    return 124
  fi
  line=$(grep -a "^AIRLOCK_VM_RESULT $VM_TOKEN " "$log" | tail -1 || true)
  if [ -z "$line" ]; then
    echo "vm: the guest reported no result; the console log is $log (run again with --verbose)" >&2
    return 125
  fi
  return "${line##* }"
}
