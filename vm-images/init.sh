#!/bin/sh
# /init of Crane's test guest (busybox sh, PID 1). It brings up what a CUDA program under
# Crane's guest library needs (proc/sys/dev, the virtio network for QEMU's user networking),
# runs the command named on the kernel command line with its output on the serial console, and
# powers the VM off when it ends, so the host sees the program's end as QEMU's (or libvirt's
# domain's) end.
#
# Kernel command line (read from /proc/cmdline; a value may be double-quoted, and then holds
# spaces but no double quote):
#   crane.run="CMD ARGS"   the command, run by sh -c (default: an interactive shell)
#   crane.env=NAME=VALUE   an environment variable for it (repeat for more)
#   crane.ip=ADDR/LEN      eth0's address (default 10.0.2.15/24, QEMU user networking's)
#   crane.gw=ADDR          default route (default 10.0.2.2)
#   crane.keep=1           do not power off at the end (print the marker and wait)
# Markers on the console: "CRANE-VM-READY" before the command starts and
# "CRANE-VM-EXIT rc=N" after it ends.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH HOME=/root LANG=C.UTF-8

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t tmpfs tmpfs /run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
exec </dev/console >/dev/console 2>&1

release=$(uname -r)
while read -r mod; do
    [ -n "$mod" ] || continue
    insmod "/lib/modules/$release/$mod" || echo "crane-init: insmod $mod failed"
done </etc/crane/modules

run="" ip=10.0.2.15/24 gw=10.0.2.2 keep=0
# Split the command line as the kernel does (spaces outside double quotes, quotes dropped),
# without the shell expanding anything in it: $VARS in crane.run are for the command's shell.
awk '{ q = 0; cur = ""
       for (i = 1; i <= length($0); i++) {
           c = substr($0, i, 1)
           if (c == "\"") { q = !q; continue }
           if (c == " " && !q) { if (cur != "") print cur; cur = ""; continue }
           cur = cur c
       }
       if (cur != "") print cur }' /proc/cmdline >/run/crane-cmdline
while IFS= read -r arg; do
    case "$arg" in
        crane.run=*) run=${arg#crane.run=} ;;
        crane.env=*=*) export "${arg#crane.env=}" ;;
        crane.ip=*) ip=${arg#crane.ip=} ;;
        crane.gw=*) gw=${arg#crane.gw=} ;;
        crane.keep=*) keep=${arg#crane.keep=} ;;
    esac
done </run/crane-cmdline

ip link set lo up
if ip link set eth0 up 2>/dev/null; then
    ip addr add "$ip" dev eth0
    ip route add default via "$gw"
fi
hostname crane-guest
[ -f /etc/crane/profile ] && . /etc/crane/profile

echo "CRANE-VM-READY"
if [ -n "$run" ]; then
    /bin/sh -c "$run"
    rc=$?
else
    setsid cttyhack /bin/sh
    rc=$?
fi
echo "CRANE-VM-EXIT rc=$rc"
sync
if [ "$keep" = 1 ]; then
    while :; do sleep 3600; done
fi
poweroff -f
reboot -f
