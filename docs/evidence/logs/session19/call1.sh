#!/bin/bash
# Session 18, call 1: start driver.sh at once in the background and hand back what it has
# after ~585 s; follow at once with `bash .gpu_tmp/wait.sh 585 DONE` (again until DONE).
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
mkdir -p /tmp/box
setsid nohup bash .gpu_tmp/driver.sh > /tmp/box/driver.out 2>&1 < /dev/null &
bash .gpu_tmp/wait.sh $(( 585 - ($(date +%s) - T0) )) DONE
