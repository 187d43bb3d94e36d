#!/usr/bin/env bash
# Make .gpu-site/: the Python packages the GPU check needs that the GPU machine's image lacks, unpacked for
# Python 3.12 on x86-64 Linux, for the device tool to carry (carry: [".gpu-site"]; 64 MiB in all with the
# repository): TRL 1.16 (the step's other side), datasets and the two packages of it the image lacks (TRL imports
# it), and bitsandbytes (QLoRA) with its CUDA 13 library only (its wheel holds one per CUDA version: 41 MiB; the
# CUDA 13.0 one is 3.7 MiB). Run here, where pip reaches the registry; the GPU machine reaches nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu-site
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any --target .gpu-site \
  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 bitsandbytes==0.50.2
find .gpu-site/bitsandbytes -name 'libbitsandbytes_*.so' ! -name 'libbitsandbytes_cuda130.so' \
  ! -name 'libbitsandbytes_cpu.so' -delete
du -sh .gpu-site
