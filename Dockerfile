# One image for every monarch role in docker-compose.yml: host agents and clients.
#
#   docker build -t monarch-nats:dev .                 # what `docker compose build` does
#   docker build -t monarch-nats:dev --build-arg TORCH=1 .   # with torch's CPU wheel
#
# Without a registry (tests/deploy/test_compose_cluster.py): any Debian-based
# image with python3 and python3-venv as BASE, and the wheels in ./wheelhouse/,
# installed with no network:
#   docker build --network none --build-arg BASE=my-debian-python \
#     --build-arg PIP_OPTIONS="--no-index --find-links /tmp/pip" -t monarch-nats:dev .
#
# The image runs as the unprivileged user `monarch`, holds no credentials (give
# them at run time: MONARCH_NATS_TOKEN, MONARCH_NATS_CREDS, ...), and has no pip,
# caches or build tools: those stay in the build stage.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# (so that the build stage left behind can be found: docker image prune --filter label=...)
LABEL org.monarch-nats.stage=build
ARG TORCH=0
ARG PIP_OPTIONS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# wheelhous[e]: the wheels of an offline build when there are any (the pattern
# may match nothing; pyproject.toml makes the COPY valid either way).
COPY pyproject.toml wheelhous[e] /tmp/pip/
COPY pyproject.toml README.md ./
COPY monarch ./monarch
RUN python3 -m venv /opt/monarch \
 && /opt/monarch/bin/pip install $PIP_OPTIONS . \
 && if [ "$TORCH" = "1" ]; then \
      /opt/monarch/bin/pip install $PIP_OPTIONS torch --index-url https://download.pytorch.org/whl/cpu; \
    fi \
 && (/opt/monarch/bin/pip uninstall -y -q setuptools wheel pip || true)

FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    PATH=/opt/monarch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY --from=build /opt/monarch /opt/monarch
RUN useradd --create-home --uid 10001 --user-group monarch
WORKDIR /app
COPY examples ./examples
USER monarch

# Host agents are the default role; clients override the command.
CMD ["monarch", "host"]
