# orch training image: CUDA PyTorch + the `orchestrator` package, run by the rendered PyTorchJob or TrainJob as
#   python -m orchestrator.launch --nproc-per-node=N -m orchestrator.trainer --config /etc/orch/train.json
# (orchestrator.launch is torchrun with an exit code that keeps the failure's class; the number of nodes,
# the node rank and the rendezvous come from the operator's PET_* environment, not from flags).
#
# Base: the official PyTorch runtime image, pinned. 2.11.0-cuda12.8-cudnn9-runtime brings
#   torch 2.11.0+cu128, CUDA 12.8 runtime, cuDNN 9 and NCCL 2.28.9 (torch's NCCL pin for 2.11/cu128),
#   Python + pip + torchrun on PATH (/opt/conda/bin), Ubuntu userland.
# Why this one: CUDA 12.8 is the first runtime with kernels for every current data-centre GPU
#   (Ampere A100, Hopper H100/H200, Blackwell B200) while still running on R570+ drivers, which
#   most clusters have; the CUDA 13 images need R580+. `runtime` (not `devel`): no compiler is
#   needed to train, and it is ~half the size. `orch doctor` prints the exact versions inside a pod.
# Any other PyTorch image works: `orch build --build-arg BASE_IMAGE=...` (its torch is kept as is).
ARG BASE_IMAGE=pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime

# --- stage 1: build the orchestrator wheel from the context -------------------------------------
FROM ${BASE_IMAGE} AS wheel
# Optional package-index settings for private mirrors and offline builds (pip reads them from env).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
WORKDIR /src
# The wheel carries the top-level Dockerfile and its script too (pyproject.toml: orchestrator.build_context),
# so the package can build this image from any folder (orch build: orchestrator/imaging/builder.py own_context).
COPY pyproject.toml README.md Dockerfile .dockerignore ./
COPY images/install-trainer.sh images/
COPY orchestrator/ orchestrator/
COPY manifests/ manifests/
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- stage 2: the training image ----------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
ARG ORCH_VERSION=0.0.0
ARG VCS_REF=unknown
ARG SOURCE_URL=""
USER root
# Install orch-trainer[train,tracking] from the wheel, never touching the base's CUDA torch
# (images/install-trainer.sh, which images/cpu/Dockerfile runs too). Build tools stay in stage 1;
# only the wheel and the script cross over (bind mounts, so they are not even a layer here).
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    --mount=type=bind,source=images/install-trainer.sh,target=/tmp/install-trainer.sh \
    set -eu; \
    sh /tmp/install-trainer.sh /tmp/wheels; \
    useradd --uid 10001 --gid 0 --create-home --no-log-init --shell /bin/bash orch; \
    mkdir -p /orch/output; \
    chown -R 10001:0 /orch; \
    chmod -R g=u /orch
LABEL org.opencontainers.image.title="orch trainer" \
      org.opencontainers.image.description="Runs orch training jobs: torchrun -m orchestrator.trainer" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.version="${ORCH_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
# /orch/output is where the trainer writes (the PyTorchJob mounts an emptyDir over it); group 0
# owns it too, so clusters that run pods under an arbitrary UID (OpenShift) can write there.
# ORCH_GIT_COMMIT: the build context's commit (orch build passes VCS_REF), a tag of the job's MLflow run.
ENV ORCH_OUTPUT_DIR=/orch/output \
    ORCH_GIT_COMMIT=${VCS_REF} \
    PYTHONUNBUFFERED=1
WORKDIR /orch
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001
CMD ["orch", "--help"]
