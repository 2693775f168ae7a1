#!/usr/bin/env bash
# bin/envcheck --worker of an aarch64 env in the emulated, compiler-less aarch64 worker (root, x86 host):
# the PASS run, then one run per missing piece (each hidden by a rename, renamed back on exit).
# Usage: run.sh PREFIX [pass|no-cc|no-sysroot|no-openssl ...]   (see README.md here)
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-05-aarch64-worker
P=$(realpath "$1"); shift
T=aarch64-conda-linux-gnu
HIDDEN=()
hide() { for f in "$@"; do mv "$f" "$f.lingbot-hidden"; HIDDEN+=("$f"); done; }
restore() { for f in "${HIDDEN[@]}"; do mv "$f.lingbot-hidden" "$f"; done; HIDDEN=(); }
trap restore EXIT
run() {  # NAME [envcheck flags]: the report in NAME.json, the text in NAME.txt, the times in NAME.time
  local name=$1; shift
  /usr/bin/time -f "%e s wall, %U s user CPU, %S s system CPU" -o "$OUT/$name.time" \
    bin/envcheck --simulate-worker --platform linux-aarch64 --prefix "$P" --json-file "$OUT/$name.json" "$@" \
    >"$OUT/$name.txt" 2>&1 || echo "exit $?" >>"$OUT/$name.time"
}
[ $# -gt 0 ] || set -- pass no-cc no-sysroot no-openssl
for what in "$@"; do
  case $what in
    pass) run pass ;;
    no-cc) hide "$P/bin/$T-cc" "$P/bin/$T-gcc" "$P/bin/$T-c++" "$P/bin/$T-g++"; run no-cc --fast; restore ;;
    no-sysroot)  # every file of the sysroot_linux-aarch64 package (glibc's dev files, kernel headers)
      mapfile -t files < <(python3 -c 'import glob, json, sys
record = json.load(open(glob.glob(sys.argv[1] + "/conda-meta/sysroot_linux-aarch64-*.json")[0]))
print("\n".join(sys.argv[1] + "/" + f for f in record["files"]))' "$P")
      hide "${files[@]}"; run no-sysroot --fast; restore ;;
    no-openssl) hide "$P/bin/openssl"; run no-openssl --fast; restore ;;
    *) echo "run.sh: unknown run $what (pass, no-cc, no-sysroot, no-openssl)" >&2; exit 2 ;;
  esac
done
