# shellcheck shell=bash
# Sourced by bin/_tool_env.sh and sim/build.sh: the Python 3.11 a venv is made from.
#   base_python_311   prints $LINGBOT_BASE_PYTHON if set, else the first of python3.11, python3 on PATH that
#                     is 3.11; prints nothing (status 1) when there is none
base_python_311() {
  if [ -n "${LINGBOT_BASE_PYTHON:-}" ]; then
    printf '%s\n' "$LINGBOT_BASE_PYTHON"
    return 0
  fi
  local candidate
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}
