#!/usr/bin/env bash
# doctor (both dtypes) under torch 2.13.0 / 2.14.1 / 2.15.0, natively and under the AVX2 imitation, fresh profiles
set -u
cd /work/main
out=runs/torchver/$(date +%H%M)
mkdir -p $out
lscpu > $out/lscpu.txt
for round in 1 2; do
  for isa in native avx2; do
    for venv in .venv /tmp/venv214 /tmp/venv215; do
      v=$($venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')
      env_isa=""; [ $isa = avx2 ] && env_isa="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"
      echo "=== round $round torch $v $isa $(date +%T)"
      env $env_isa HF_HUB_OFFLINE=1 HF_SPECDIFF_COSTS=/tmp/costs-$round-$v-$isa $venv/bin/hf-specdiff doctor --dtype auto > $out/doctor-$round-$v-$isa.txt 2>&1
      cp /tmp/costs-$round-$v-$isa/*.json $out/ 2>/dev/null
      tail -4 $out/doctor-$round-$v-$isa.txt
    done
  done
done
