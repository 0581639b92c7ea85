#!/usr/bin/env bash
# Build the Hugging Face Space image (./Dockerfile) with podman on a machine that reaches no container
# registry, serve it as a Space does (uid 1000, port 7860) and run one hosted job through its API.
#
#   scripts/build_space.sh
#
# 1. The base image `python:3.11-slim` is made from Debian bookworm (debootstrap, Debian's Python 3.11
#    and pip) and imported under that name, once; the root file system is cached as a tarball.
# 2. The image is built from the committed tree (HEAD; SPACE_WORKTREE=1 takes the working tree) with
#    two settings: TORCH_INDEX_URL (a build argument of the Dockerfile) and this machine's pip setup
#    (CA bundle, the folder holding the CPU wheel of torch), mounted at /etc/xdg/pip during the build.
# 3. The container runs as uid 1000 on 127.0.0.1:$SPACE_PORT; once the page answers, the Models
#    tab's "Check pair" runs on the offline default pair (minilm / minilm-movies) through gradio_client,
#    which waits for the default fine-tune the server starts on its first launch.
#
# Environment: SPACE_BUILD_DIR (/work/space-build: tarball, build context, logs, summary), SPACE_IMAGE
# (localhost/graftui-space), SPACE_PORT (7860), TORCH_INDEX_URL (https://pypi.org/simple), SPACE_WHEELS
# (/opt/wheels), DEBIAN_MIRROR, SPACE_JOB_TIMEOUT (2400 s), PYTHON (.venv/bin/python, for gradio_client).
# Run it as root (debootstrap, chroot and rootful podman).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=${SPACE_BUILD_DIR:-/work/space-build}
image=${SPACE_IMAGE:-localhost/graftui-space}
port=${SPACE_PORT:-7860}
torch_index=${TORCH_INDEX_URL:-https://pypi.org/simple}
wheels=${SPACE_WHEELS:-/opt/wheels}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
job_timeout=${SPACE_JOB_TIMEOUT:-2400}
python=${PYTHON:-$repo/.venv/bin/python}
base=python:3.11-slim
container=graftui-space-run

log() { printf '[build_space %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (debootstrap, chroot, rootful podman)"
for tool in podman debootstrap curl git; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install -y podman buildah debootstrap runc curl)"
done
grep -q "^FROM $base\$" "$repo/Dockerfile" || die "the Dockerfile no longer starts FROM $base"
mkdir -p "$work"

# -- 1. the base image ---------------------------------------------------------------------------------
base_tar=$work/base/python-3.11-slim.tar
if [[ ! -f $base_tar ]]; then
  log "making the base root file system (debootstrap bookworm, Python 3.11) in $work/base"
  root=$work/base/rootfs
  rm -rf "$root" && mkdir -p "$work/base"
  nice -n 10 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/base/debootstrap.log" 2>&1 \
    || die "debootstrap failed, see $work/base/debootstrap.log"
  nice -n 10 chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c '
      apt-get update -qq &&
      apt-get install -y -qq --no-install-recommends python3.11 python3-pip python3-venv python-is-python3 \
        ca-certificates &&
      apt-get clean' >"$work/base/python.log" 2>&1 || die "installing Python failed, see $work/base/python.log"
  rm -rf "$root"/var/lib/apt/lists/*
  # The official image lets pip install system-wide, and the Dockerfile relies on it: drop PEP 668's marker.
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  [[ -x $root/usr/bin/python && -x $root/usr/bin/pip ]] || die "the base has no python or pip on PATH"
  tar -C "$root" --numeric-owner -cf "$base_tar.part" . && mv "$base_tar.part" "$base_tar"
  rm -rf "$root"
fi

# -- podman settings that work on this machine ---------------------------------------------------------
# crun refuses a host with cgroup v1 and v2 mounted together, and podman lowers its own process limit
# below the one it asks for in a container (then setrlimit fails without CAP_SYS_RESOURCE): try the
# plain settings first, then runc with the limits this shell has, then no cgroups and vfs storage.
nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
[[ $nofile == unlimited ]] && nofile=1048576
[[ $nproc == unlimited || $nproc -gt 32768 ]] && nproc=32768
limits="--ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc"
cgroupfs="--runtime runc --cgroup-manager cgroupfs --events-backend file"
candidates=(  # podman's own options | a container's | a build's
  "||"
  "--runtime runc|$limits|$limits"
  "$cgroupfs|$limits --cgroups disabled|$limits"
  "$cgroupfs --storage-driver vfs|$limits --cgroups disabled|$limits --isolation chroot"
)
probe=$work/probe
mkdir -p "$probe"
printf 'FROM %s\nRUN python -c "import pip"\n' "$base" >"$probe/Dockerfile"
podman=() ctr=() bld=()
for candidate in "${candidates[@]}"; do
  IFS='|' read -r own run_opts build_opts <<<"$candidate"
  read -r -a podman <<<"podman $own"
  read -r -a ctr <<<"$run_opts"
  read -r -a bld <<<"$build_opts"
  if ! "${podman[@]}" image exists "$base" 2>/dev/null; then
    log "importing $base into podman (${podman[*]})"
    "${podman[@]}" import -q --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$base_tar" "$base" >/dev/null || continue
    # FROM python:3.11-slim may resolve to either name, depending on registries.conf
    "${podman[@]}" tag "$base" "docker.io/library/$base" >/dev/null || true
  fi
  if "${podman[@]}" run --rm "${ctr[@]}" "$base" python -c "import pip" >"$work/podman-probe.log" 2>&1; then
    # a build's RUN goes through the runtime too; chroot isolation needs none
    for isolation in "" "--isolation chroot"; do
      # shellcheck disable=SC2206
      try=("${bld[@]}" $isolation)
      if "${podman[@]}" build --pull=never "${try[@]}" -t localhost/build-space-probe "$probe" \
          >>"$work/podman-probe.log" 2>&1; then
        bld=("${try[@]}")
        break 2
      fi
    done
  fi
  log "podman ${own:-(plain)} | run ${run_opts:-(as is)} | build ${build_opts:-(as is)}: $(tail -1 "$work/podman-probe.log")"
  podman=()
done
((${#podman[@]})) || die "no podman settings run a container and a build here, see $work/podman-probe.log"
"${podman[@]}" rmi localhost/build-space-probe >/dev/null 2>&1 || true
log "podman settings: ${podman[*]} | run ${ctr[*]:-(as is)} | build ${bld[*]:-(as is)}"

# -- 2. build --------------------------------------------------------------------------------------------
torch_pin=$(grep -o 'torch==[0-9][0-9.]*' "$repo/Dockerfile" | head -1)
[[ -n $torch_pin ]] || die "no torch==X pin in the Dockerfile"
# PyPI's Linux x86_64 wheel of torch is the CUDA build (with its nvidia-* wheels); the CPU build is the
# local wheel, and the constraint makes the build fail rather than fetch the other one.
compgen -G "$wheels/torch-${torch_pin#torch==}+cpu-cp311-*x86_64.whl" >/dev/null \
  || die "no CPU wheel of $torch_pin for Python 3.11 in $wheels (SPACE_WHEELS)"
pipdir=$work/pip
mkdir -p "$pipdir/wheels"
cp /etc/ssl/certs/ca-certificates.crt "$pipdir/ca-certificates.crt"  # this machine's CAs (its TLS proxy's included)
echo "${torch_pin}+cpu" >"$pipdir/constraints.txt"
cat >"$pipdir/pip.conf" <<EOF
[global]
cert = /etc/xdg/pip/ca-certificates.crt
find-links = /etc/xdg/pip/wheels
constraint = /etc/xdg/pip/constraints.txt
EOF

context=$work/context
rm -rf "$context" && mkdir -p "$context"
if [[ ${SPACE_WORKTREE:-0} == 1 ]]; then
  tar -C "$repo" --exclude-from="$repo/.dockerignore" --exclude=.git --exclude=.venv -cf - . | tar -C "$context" -xf -
  revision="working tree of $(git -C "$repo" rev-parse --short HEAD)"
else
  git -C "$repo" archive HEAD | tar -C "$context" -xf -
  revision=$(git -C "$repo" rev-parse --short HEAD)
fi

log "building $image from $revision (log: $work/build.log)"
start=$(date +%s)
nice -n 10 "${podman[@]}" build --pull=never --network host "${bld[@]}" \
  --build-arg "TORCH_INDEX_URL=$torch_index" \
  -v "$pipdir:/etc/xdg/pip:ro" -v "$wheels:/etc/xdg/pip/wheels:ro" \
  -f "$repo/Dockerfile" -t "$image" "$context" >"$work/build.log" 2>&1 \
  || { tail -20 "$work/build.log" >&2; die "the build failed, see $work/build.log"; }
build_s=$(($(date +%s) - start))
size_bytes=$("${podman[@]}" image inspect -f '{{.Size}}' "$image")
size=$(awk -v b="$size_bytes" 'BEGIN { printf "%.2f GB (%.2f GiB)", b / 1e9, b / 2^30 }')
torch_in_image=$("${podman[@]}" run --rm "${ctr[@]}" --user 1000 "$image" \
  python -c "import torch; print(torch.__version__)" 2>/dev/null)
log "built in ${build_s}s: $size, torch $torch_in_image"

# -- 3. serve and run one job ----------------------------------------------------------------------------
"${podman[@]}" rm -f "$container" >/dev/null 2>&1 || true
trap '"${podman[@]}" logs "$container" >"$work/container.log" 2>&1 || true; "${podman[@]}" rm -f "$container" >/dev/null 2>&1 || true' EXIT
# The container inherits podman's niceness (its default fine-tune shares this busy machine), and it is
# reached directly, not through a Space's proxy, so no X-Forwarded-For is believed (see the Dockerfile).
start=$(date +%s)
nice -n 10 "${podman[@]}" run -d --name "$container" --user 1000 -p "127.0.0.1:$port:7860" "${ctr[@]}" \
  -e GRAFTUI_TRUSTED_PROXIES=0 "$image" >/dev/null
url=http://127.0.0.1:$port/
until [[ $(curl -s -o /dev/null -w '%{http_code}' "$url") == 200 ]]; do
  [[ $("${podman[@]}" inspect -f '{{.State.Running}}' "$container") == true ]] \
    || { "${podman[@]}" logs "$container" 2>&1 | tail -20 >&2; die "the container stopped"; }
  (($(date +%s) - start < 600)) || die "no page after 600 s"
  sleep 1
done
page_s=$(($(date +%s) - start))
log "page served after ${page_s}s; checking the default pair (waits for the default fine-tune)"

job=$(SPACE_URL=$url SPACE_JOB_TIMEOUT=$job_timeout "$python" - <<'EOF'
import json, os, time

from gradio_client import Client

url, deadline = os.environ["SPACE_URL"], time.time() + float(os.environ["SPACE_JOB_TIMEOUT"])
client = Client(url, verbose=False, download_files=False)
sid = client.predict("", api_name="/on_load")[1]  # the session id the page keeps
params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/on_check"]["parameters"]
given = {"Base model": "minilm", "Fine-tuned model": "minilm-movies", "Task": "movies"}  # by the fields' labels
args = [sid] + [next((v for k, v in given.items() if p["label"].startswith(k)), p["parameter_default"])
                for p in params[1:]]
start = time.time()
while True:
    t = time.time()
    out = [o for o in client.predict(*args, api_name="/on_check") if isinstance(o, str)]
    if any("Pair checked" in o for o in out):
        answer = next(o for o in out if o.startswith("✓ **"))
        break
    if not any("being prepared" in o for o in out) or time.time() > deadline:
        raise SystemExit(f"unexpected answer: {out}")
    time.sleep(10)
print(json.dumps({"answer": answer, "job_s": round(time.time() - start), "check_s": round(time.time() - t, 1)}))
EOF
) || die "the job failed (container log: $work/container.log)"
# the default fine-tune is the server's own job: its record says how long it ran
prepare_s=$("${podman[@]}" exec "$container" python -c '
import glob, json, os
jobs = [json.load(open(f)) for f in glob.glob(os.environ["GRAFTUI_HOME"] + "/jobs/*/job.json")]
print(next(round(j["finished"] - j["started"]) for j in jobs if j["kind"] == "prepare" and j["finished"]))' \
  2>/dev/null || echo "?")
"${podman[@]}" stop -t 10 "$container" >/dev/null

# -- 4. summary ------------------------------------------------------------------------------------------
field() { "$python" -c "import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$job" "$1"; }
summary=$(cat <<EOF
date           $(date -u '+%F %H:%M UTC'), $(nproc) CPU cores, load average $(cut -d' ' -f1-3 /proc/loadavg)
image          $image ($revision), torch $torch_in_image
podman         ${podman[*]} | run ${ctr[*]:-(as is)} | build ${bld[*]:-(as is)}
build          ${build_s} s
image size     $size
first page     ${page_s} s after podman run
job            Check pair minilm / minilm-movies: $(field answer)
job time       $(field job_s) s from the first call to the answer, $(field check_s) s for the check that answered;
               the server's default fine-tune ('Prepare default model', started with it) ran ${prepare_s} s
EOF
)
printf '%s\n' "$summary" | tee "$work/summary.txt"
