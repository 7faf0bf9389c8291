# One image for every loopsq process: `loopsq scheduler`, `loopsq worker`, `loopsq web` (see docker-compose.yml),
# or, by default, `loopsq up` (everything in one container, with the embedded Redis persisting in /data).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LOOPSQ_DATA_DIR=/data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY loopsq ./loopsq
COPY worker ./worker
RUN pip install . \
    && useradd --create-home --uid 10001 loopsq \
    && mkdir -p /data \
    && chown loopsq /data \
    && chmod 700 /data

USER loopsq
VOLUME ["/data"]
CMD ["loopsq", "up"]
