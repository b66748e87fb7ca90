#!/usr/bin/env bash
# Mesa's lavapipe: a real Vulkan device that runs on the CPU, so that the GPU kernels (gpu/) and
# `transformer devices` are tested in CI without a GPU. Installs Debian's mesa-vulkan-drivers
# and the Vulkan loader (libvulkan1) when the lavapipe driver is missing (apt-get, as root or
# through sudo); about 30 s with the download.
set -euo pipefail
if ls /usr/share/vulkan/icd.d/lvp_icd*.json > /dev/null 2>&1 && ldconfig -p | grep -q libvulkan.so.1; then
    exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
fi
packages=(mesa-vulkan-drivers libvulkan1)
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" > /dev/null \
    || { $sudo apt-get update -qq > /dev/null \
        && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" > /dev/null; }
