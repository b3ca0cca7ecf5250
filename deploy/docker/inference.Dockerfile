# The inference service alone: only the packages it needs.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
# CPU build from the PyTorch index; on GPU hosts use the CUDA wheel index instead.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY libs/rpc /app/libs/rpc
COPY libs/common /app/libs/common
COPY libs/weights /app/libs/weights
COPY libs/text /app/libs/text
COPY libs/models /app/libs/models
COPY services/inference /app/services/inference
RUN pip install /app/libs/rpc /app/libs/common /app/libs/text /app/libs/weights /app/libs/models /app/services/inference
ENTRYPOINT ["python", "-m", "tidal.inference"]
