# The training image for GKE (tpu_scripts/gke_launch.sh builds it, from a clean tree of one
# commit): the project installed once as a wheel, jax[tpu] pinned to the jax the pre-flight
# compiled with, and the configs runs read. Nothing is installed when a container starts, so
# a JobSet restart starts the same code at once.
#   docker build --build-arg JAX_VERSION=0.10.2 -t IMAGE .
ARG BASE_IMAGE=python:3.11-slim

# A wheel of the tree in the build context (no source tree or build tools in the image).
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${BASE_IMAGE}
# jax[tpu]'s version: the one of the checkout that ran the pre-flight (required).
ARG JAX_VERSION
# The project's extras: gcs reaches gs:// workdirs; add e.g. seqio for C4.
ARG EXTRAS=gcs
WORKDIR /app
COPY --from=wheel /dist/ /tmp/dist/
RUN test -n "${JAX_VERSION}" || { echo "error: --build-arg JAX_VERSION=<the checkout's jax> is required" >&2; exit 2; }; \
    wheel="$(ls /tmp/dist/*.whl)" && \
    pip install --no-cache-dir "${wheel}[${EXTRAS}]" "jax[tpu]==${JAX_VERSION}" && \
    rm -rf /tmp/dist
COPY configs/ /app/configs/
# xpk gives the command; this default only says what is inside.
CMD ["python", "-m", "gated_attention.main", "--help"]
