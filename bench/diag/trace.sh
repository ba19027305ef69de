#!/bin/bash
# trace.sh AIRLOCK OUTPREFIX N : drive N jobs under perf (sched exit tracepoints, CLOCK_MONOTONIC)
set -e
bin=$1; out=$2; n=${3:-20}
perf record -q -k CLOCK_MONOTONIC -a -e sched:sched_process_exit -e syscalls:sys_enter_exit_group -e syscalls:sys_exit_wait4 --filter 'comm == "init"' -e syscalls:sys_enter_write --filter 'comm == "init"' -o $out.perf.data -- python3 "$(dirname "$0")/drive.py" $bin $n 0.05 $out.json 2>&1 | tail -2
perf script -i $out.perf.data -F comm,pid,tid,time,event 2>/dev/null > $out.events
python3 "$(dirname "$0")/analyse.py" $out.json $out.events
