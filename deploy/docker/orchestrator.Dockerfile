# The orchestrator service alone: only the packages it needs.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY libs/rpc /app/libs/rpc
COPY libs/common /app/libs/common
COPY libs/weights /app/libs/weights
COPY libs/text /app/libs/text
COPY libs/batch /app/libs/batch
COPY services/orchestrator /app/services/orchestrator
RUN pip install /app/libs/rpc /app/libs/common /app/libs/text /app/libs/weights /app/libs/batch '/app/services/orchestrator[reasoning-gym]'
ENTRYPOINT ["python", "-m", "tidal.orchestrator"]
