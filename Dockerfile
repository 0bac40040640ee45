# One image for every monarch role in docker-compose.yml: host agents and clients.
# Torch is optional (the examples need none); build with --build-arg TORCH=1 to add
# the CPU wheel.
FROM python:3.11-slim

ARG TORCH=0
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY monarch ./monarch
RUN pip install . \
 && if [ "$TORCH" = "1" ]; then \
      pip install torch --index-url https://download.pytorch.org/whl/cpu; \
    fi
COPY examples ./examples

# Host agents are the default role; clients override the command.
CMD ["monarch", "host"]
