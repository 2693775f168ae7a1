# shellcheck shell=bash
# Sourced by every bin/* entry point: make sure the tool environment (.venv at the repo root) exists
# and matches pyproject.toml, then leave its python in $TOOL_PYTHON.
# A .venv without its ready-marker (a killed or failed build) is never reused: it is rebuilt.

fallback_python=
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$repo_root/.venv"
marker="$venv/.lingbot-ready"
want=$(sha256sum "$repo_root/pyproject.toml" | cut -d" " -f1)

tool_env_ready() { [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ]; }

# A worker (ubuntu:22.04) may lack the Python the login node built .venv with: the complete .venv is
# then left alone and the provisioned env's own python runs the command (it has trainer and provision).
if [ -f "$marker" ] && ! "$venv/bin/python" -c '' 2>/dev/null; then
  for env_python in "${LINGBOT_ENV_PYTHON:-}" "${CONDA_PREFIX:+$CONDA_PREFIX/bin/python}" \
      "${CONDA_ENVS_PATH:+${CONDA_ENVS_PATH%%:*}/lingbot-b200/bin/python}" "$HOME/.conda/envs/lingbot-b200/bin/python"; do
    if [ -n "$env_python" ] && "$env_python" -c 'import trainer, provision' >/dev/null 2>&1; then
      echo "bin: $venv cannot run on this node (its base Python is missing); using $env_python" >&2
      fallback_python=$env_python
      break
    fi
  done
  if [ -z "${fallback_python:-}" ]; then
    echo "bin: $venv was built with a Python this node does not have, and no provisioned env was found" >&2
    echo "bin: provision the env (bin/provision lingbot-b200) or set LINGBOT_ENV_PYTHON=<prefix>/bin/python" >&2
    exit 2
  fi
fi

if [ -z "${fallback_python:-}" ] && ! tool_env_ready; then
  exec 9>"$repo_root/.venv.lock"
  flock 9  # another bin/* may be building it right now: wait for that one
  if ! tool_env_ready; then
    # shellcheck source=bin/_base_python.sh
    . "$repo_root/bin/_base_python.sh"
    base_python=$(base_python_311) || base_python=
    if [ -z "$base_python" ]; then
      echo "bin: the tool environment needs Python 3.11 (none found on PATH; set LINGBOT_BASE_PYTHON)" >&2
      exit 2
    fi
    log="$repo_root/.venv.log"
    if [ -f "$marker" ] && [ -x "$venv/bin/python" ]; then
      # A complete env built from an older pyproject.toml: update it in place (processes may be using it).
      echo "bin: pyproject.toml changed; updating the tool environment $venv ..." >&2
      rm -f "$marker"
    else
      echo "bin: creating the tool environment $venv (first run; a few minutes) ..." >&2
      rm -rf "$venv"
      "$base_python" -m venv "$venv" >"$log" 2>&1 || { cat "$log" >&2; exit 2; }
    fi
    # pip pinned: the lock's `pip install --dry-run --report --platform ...` needs pip >= 23.3
    # --no-compile, then compileall on every core: pip byte-compiles its ~20k files on one core (torch's
    # alone: 51 s -> 42 s for the whole build on 2 cores, measured); imports need the .pyc files, since
    # PYTHONDONTWRITEBYTECODE=1 environments would otherwise compile torch afresh in every process.
    if ! { "$venv/bin/python" -m pip install -q --disable-pip-version-check "pip==26.3" &&
           "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile -e "${repo_root}[test]" &&
           { "$venv/bin/python" -m compileall -q -j 0 \
               "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" ||
             echo "bin: compileall reported files it could not compile (pip's own compile skips those too)"; }
         } >>"$log" 2>&1; then
      grep -v 'is ignored: it is neither a file nor a directory' "$log" >&2 || true
      echo "bin: setting up $venv failed (log above, also in $log); it is rebuilt on the next run" >&2
      exit 2
    fi
    printf '%s' "$want" >"$marker"
    echo "bin: tool environment ready" >&2
  fi
  exec 9>&-
fi
# shellcheck disable=SC2034  # used by the script that sources this file
TOOL_PYTHON=${fallback_python:-$venv/bin/python}
# The one repository-root notion (provision/paths.py) follows the checkout these bin/* belong to.
export LINGBOT_REPO_ROOT="$repo_root"
