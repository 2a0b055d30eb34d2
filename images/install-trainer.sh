#!/bin/sh
# Installs orch-trainer[train,tracking] (tracking: the MLflow client, TensorBoard) from the wheel in $1 into the
# image's Python, never touching the torch already there (the CUDA base's, or the CPU image's torch stage):
# every torch/triton/nvidia-* package present becomes a constraint, so pip either keeps them or fails the
# build; then it checks that torch's version did not move and that torchrun is on PATH.
# Both Dockerfiles run this one script, so their checks cannot drift apart.
set -eu
wheels="$1"
python -m pip list --format=freeze | grep -iE '^(torch|triton|nvidia-)' > /tmp/keep-torch.txt
before="$(python -c 'import torch; print(torch.__version__)')"
python -m pip install --no-cache-dir --disable-pip-version-check \
    --constraint /tmp/keep-torch.txt "$(ls "$wheels"/orch_trainer-*.whl)[train,tracking]"
after="$(python -c 'import torch; print(torch.__version__)')"
test "$before" = "$after" || { echo "pip replaced torch $before with $after" >&2; exit 1; }
rm /tmp/keep-torch.txt
command -v torchrun
