# deltatail: follow a Delta table's log into Kafka (or another sink).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY state ./state
COPY tailer ./tailer
COPY sinks ./sinks
RUN pip install --no-cache-dir . \
 && mkdir /state && chown nobody /state
# A named volume mounted at /state starts as a copy of this directory, owned by the service's user.
USER nobody
ENTRYPOINT ["deltatail"]
CMD ["--help"]
