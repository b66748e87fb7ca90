#!/usr/bin/env bash
# The Python package (python/): its wheel built once, in the root's target/ with python/'s
# `dev` profile, which has the root's test settings: the dependencies `cargo test` compiled
# are reused and only the two crates are compiled (18-80 s here, against a whole release
# build of the crate and its dependencies in python/target before), then
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
CARGO_TARGET_DIR="$PWD/target" "$venv/bin/maturin" build --profile dev --manifest-path python/Cargo.toml \
    --interpreter "$venv/bin/python" --out target/wheels
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps target/wheels/*.whl
"$venv/bin/python" -m pytest -q python/tests
