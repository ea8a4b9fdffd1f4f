# GPU image for the trainer (first draft): CUDA 13 runtime, Python 3.12, the stack verified on H200
# (torch 2.11.0+cu130, fbgemm-gpu 1.6.0, torchrec 1.6.1), then this repo.
#   docker build -t dlrm-v2 .
#   docker run --gpus all --ipc=host dlrm-v2 torchrun --nproc_per_node 8 train.py model=dlrm_v2 model.row_cap=4000000
# torchx: torchx run -s local_docker launch/components.py:trainer --image dlrm-v2 -j 1x8 --gpu 8 -- <overrides>
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ENV DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0

RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# Order matters: torchrec goes in without its declared deps (they would replace fbgemm-gpu's build).
RUN pip install --no-cache-dir torch==2.11.0 --index-url ${TORCH_INDEX_URL} \
    && pip install --no-cache-dir fbgemm-gpu==1.6.0 --index-url ${TORCH_INDEX_URL} \
    && pip install --no-cache-dir --no-deps torchrec==1.6.1
WORKDIR /workspace/dlrm
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN python -c "import torch, torchrec, fbgemm_gpu; print(torch.__version__, torchrec.__version__)"
CMD ["python", "train.py"]
