#!/usr/bin/env bash
# `make test-gpu` on the device (image python3, no venv).
make test-gpu 2>&1 | tail -30
