# One image for every shardbus service; compose picks the service with `shardbus run NAME`.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY shardbus ./shardbus
COPY shared ./shared
COPY services ./services
COPY simulator ./simulator
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 shardbus \
    && mkdir -p /var/lib/shardbus/modules && chown -R shardbus /var/lib/shardbus
USER shardbus
ENV SHARDBUS_HEALTH_FILE=/tmp/shardbus.health
ENTRYPOINT ["shardbus"]
