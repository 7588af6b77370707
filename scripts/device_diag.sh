#!/usr/bin/env bash
# Quick diagnosis of gpuslice run on a GPU machine: each step bounded.
B=.device-carry; G=$B/gpuslice; P=$B/gpuslice-cuda-probe
t() { echo "== $*"; timeout -s KILL 25 "$@" 2>&1 | tail -15; echo "rc=${PIPESTATUS[0]}"; }
t $G run --gpus 0 -- /bin/true
t $G run --gpus none -- /bin/true
t $G run --gpus none -- sh -c 'ls /dev | tr "\n" " "; echo; grep Modify /proc/driver/nvidia/params; ls /proc/driver/nvidia/gpus/*'
t $G run --gpus none --isolation env -- $P --ignore-visible-devices
t $G run --gpus none --isolation cgroup -- $P --ignore-visible-devices
t $G run --gpus 0 -- $P
t $G run --gpus none --isolation namespace -- $P --ignore-visible-devices
t $G run --gpus none -- $P --ignore-visible-devices
t $G run --gpus none -- $P
