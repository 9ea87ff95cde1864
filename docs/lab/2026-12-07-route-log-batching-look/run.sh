#!/bin/bash
# alternating old/new with a file route log; 64 lockstep clients, testing server
set -u
for i in 1 2 3; do
  for tree in old new; do
    if [ $tree = old ]; then dir=/tmp/old; else dir=/work/main; fi
    st=/tmp/rlb/state_${tree}_$i; rm -rf $st; mkdir -p $st
    echo "=== run $i $tree load $(cut -d' ' -f1 /proc/loadavg)"
    (cd $dir && PYTHONPATH=$dir python benchmarks/bench_server.py --workdir=/tmp/bw --backends=testing_server \
      --clients=64 --requests=24 --passthrough=1 --server_args="--memory_path=$st/memory.npz" 2>&1 | grep -E "^\|" )
  done
done
