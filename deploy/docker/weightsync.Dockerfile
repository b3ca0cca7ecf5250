# The weightsync service alone, installed from this repo's wheels (make dist) and a wheelhouse of
# its third-party dependencies: no torch (registry, retention, uploads).
#   BASE_IMAGE: python:3.11-slim in the wild, tidal-base:bookworm (deploy/base-image.sh) offline.
#   PIP_ARGS:   where pip finds third-party wheels; the default is offline (dist/wheelhouse,
#               make wheelhouse). Online: --build-arg PIP_ARGS="--extra-index-url ..." .
# Build context: the repo root; .dockerignore sends only dist/ (docs/deployment.md).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# Lets a clean-up find (and prune) this stage, which the classic builder leaves untagged.
LABEL org.tidal.build-stage=true
ARG PIP_ARGS="--no-index --find-links /wheels/wheelhouse"
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY dist /wheels
RUN python3 -m venv /opt/tidal \
 && /opt/tidal/bin/pip install ${PIP_ARGS} --find-links /wheels "tidal-weightsync" \
 && /opt/tidal/bin/pip uninstall -q -y pip

FROM ${BASE_IMAGE}
# Marks the service image, so a test can prune its superseded (untagged) copies alone.
LABEL org.tidal.image=true
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PATH=/opt/tidal/bin:$PATH
# A fixed non-root uid, so a host folder bind-mounted for outputs can be chowned to it.
RUN groupadd --gid 10001 tidal && useradd --uid 10001 --gid tidal --no-create-home --shell /usr/sbin/nologin tidal \
 && mkdir -p /outputs /weights /tls && chown tidal:tidal /outputs /weights /tls
COPY --from=build /opt/tidal /opt/tidal
USER tidal
WORKDIR /outputs
EXPOSE 50054
# The gRPC health service over the service's own (m)TLS, from TIDAL_SECURITY__* env vars.
# Generous timeouts: on a loaded host the probe's interpreter start alone took 7 s.
HEALTHCHECK --interval=10s --timeout=30s --start-period=120s --retries=5 \
  CMD ["python", "-m", "tidal.common.grpc.health_probe", "--address", "127.0.0.1:50054", "--timeout-s", "20", "--role", "weightsync"]
ENTRYPOINT ["python", "-m", "tidal.weightsync"]
