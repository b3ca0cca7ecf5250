# One node of the SLURM cluster in containers (docs/distributed.md, "A SLURM cluster in
# containers"): Debian's slurmctld, slurmd and munge beside every Tidal wheel, so the same
# image is the controller (`controller`: munged + slurmctld) and each compute node
# (`compute`: munged + slurmd), and `tidal rl` on the controller renders and submits jobs
# whose services run from the same /opt/tidal on every node.
#   BASE_IMAGE: tidal-base:bookworm (deploy/base-image.sh), built from Debian packages alone.
# Build context: a folder holding dist/ (this repo's wheels and dist/wheelhouse) and
# deploy/slurm/ (tests/cluster/cluster.py assembles it with hard links).
# Layers, slowest-changing first: the SLURM packages, the third-party wheels (torch), then
# this repo's wheels alone, so a code change rebuilds only the last, small layer.
ARG BASE_IMAGE=tidal-base:bookworm
FROM ${BASE_IMAGE}
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PATH=/opt/tidal/bin:$PATH \
    HOME=/root MPLCONFIGDIR=/tmp/matplotlib PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY deploy/slurm/install-packages.sh /usr/local/sbin/
RUN install-packages.sh && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
      /usr/share/doc/* /usr/share/man/* \
 && command -v slurmctld slurmd munged sbatch >/dev/null
COPY dist/wheelhouse /wheels/wheelhouse
RUN python3 -m venv /opt/tidal \
 && /opt/tidal/bin/pip install -q --no-index /wheels/wheelhouse/*.whl \
 && rm -rf /wheels
COPY dist/*.whl /wheels/
RUN /opt/tidal/bin/pip install -q --no-index --no-deps /wheels/*.whl && rm -rf /wheels
COPY deploy/slurm/node-entrypoint.sh /usr/local/sbin/
ENTRYPOINT ["node-entrypoint.sh"]
CMD ["compute"]
