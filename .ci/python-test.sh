#!/usr/bin/env bash
# The Python package (python/): its wheel built once (release profile, in python/target: most
# of this step is compiling the crate and its dependencies again, optimised; measured 6 min of
# CPU, 30 min wall on 2 cores shared with five other builds), then
# installed with numpy and pytest into a virtual environment under target/, then its tests
# (python/tests; those that need ../shared skip without it). Later steps reuse the wheel in
# target/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "maturin>=1.5,<2" numpy pytest
rm -rf target/wheels
"$venv/bin/maturin" build --release --manifest-path python/Cargo.toml \
    --interpreter "$venv/bin/python" --out target/wheels
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps target/wheels/*.whl
"$venv/bin/python" -m pytest -q python/tests
