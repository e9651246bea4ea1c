# spot-autoscaler daemon image. Build: docker build -t spot-autoscaler:0.1.0 .
# Horovod is not needed here: the daemon only talks to the API server and the clouds.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY autoscaler ./autoscaler
# A venv is self-contained, so the runtime stage copies it whole; pip compiles the bytecode
# here because the runtime root filesystem is read-only. constraints.txt (scripts/lock.sh) pins
# every dependency: two builds of one commit install the same versions.
RUN python -m venv /opt/venv && /opt/venv/bin/pip install -c constraints.txt '.[all]'

FROM python:3.11-slim
RUN groupadd --system --gid 65532 autoscaler \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin autoscaler
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9090
ENTRYPOINT ["spot-autoscaler"]
CMD ["run", "--config", "/etc/spot-autoscaler/config.yaml"]
