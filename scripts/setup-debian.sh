#!/usr/bin/env bash
# Installs what attnhost needs to build on Debian 12 or Ubuntu 22.04+ (run as root or with sudo).
# The CUDA toolkit, NCCL and cuDNN are used when they are installed (nvcc on PATH or in
# /usr/local/cuda); without them attnhost builds its CPU configuration.
set -euo pipefail
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends \
  cmake ninja-build g++ make git ca-certificates \
  libboost-dev libboost-program-options-dev libtomlplusplus-dev doctest-dev \
  libopenmpi-dev openmpi-bin gnuplot-nox > /dev/null
echo "setup: build dependencies installed"
