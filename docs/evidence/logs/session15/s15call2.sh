#!/bin/bash
# Session 15, call 2: the reproduce driver in the background (publish + 6 verifies +
# replicate structure), with the spacer drawn from 1-256 granules; wait for it.
set -u; T0=$(date +%s)
. .gpu_tmp/setup.sh; cd /tmp/k; cat .head; echo
mkdir -p /tmp/box
setsid nohup bash .gpu_tmp/s15driver.sh > /tmp/box/driver.out 2>&1 < /dev/null &
sed -i 's/reproduce_h200.json/reproduce.json/' .gpu_tmp/wait.sh
bash .gpu_tmp/wait.sh $(( 585 - ($(date +%s) - T0) )) DONE
