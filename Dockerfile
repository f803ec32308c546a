# deltatail: follow a Delta table's log into Kafka (or another sink).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY state ./state
COPY tailer ./tailer
COPY sinks ./sinks
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["deltatail"]
CMD ["--help"]
