# The weightsync service alone: only the packages it needs.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY libs/rpc /app/libs/rpc
COPY libs/common /app/libs/common
COPY libs/weights /app/libs/weights
COPY services/weightsync /app/services/weightsync
RUN pip install /app/libs/rpc /app/libs/common /app/libs/weights /app/services/weightsync
ENTRYPOINT ["python", "-m", "tidal.weightsync"]
