# One image for every shardbus service; compose picks the service with `shardbus run NAME`.
# PYTHON_IMAGE: another Python 3.11 base with pip (a mirror's copy; tests/deploy/test_compose_up.py).
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}
WORKDIR /app
# The runtime packages from requirements-runtime.lock (exact versions, their hashes checked), then
# the project over them without dependencies (docs/operations.md, "The lock file").
COPY requirements-runtime.lock ./
RUN pip install --no-cache-dir --require-hashes -r requirements-runtime.lock
COPY pyproject.toml README.md ./
COPY shardbus ./shardbus
COPY shared ./shared
COPY services ./services
COPY simulator ./simulator
RUN pip install --no-cache-dir --no-deps . \
    && useradd --system --uid 10001 shardbus \
    && mkdir -p /var/lib/shardbus/modules && chown -R shardbus /var/lib/shardbus
USER shardbus
ENV SHARDBUS_HEALTH_FILE=/tmp/shardbus.health
ENTRYPOINT ["shardbus"]
