#!/usr/bin/env bash
# Starts Azurite 3.35.0's Table service offline, in memory, on a loopback port.
#
# It comes from the npm package azurite@3.35.0 (the last that runs on Node.js 20), installed on
# first use into a cache outside the source tree ($FANLINE_CACHE_DIR, default
# ${XDG_CACHE_HOME:-~/.cache}/fanline), so later starts are offline. Connect with Azurite's
# development account (docs/operations.md, "Running on Azure"):
#   DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;TableEndpoint=http://127.0.0.1:PORT/devstoreaccount1;
#
# Usage: localstack/azurite.sh [--port N] [--stop-on-stdin-eof]
#   --port N              port to listen on (default 10002)
#   --stop-on-stdin-eof   run until standard input closes, then stop Azurite. The test suite
#                         uses this so that no process outlives the test run, even when the
#                         tests are killed.
set -euo pipefail

port=10002
stop_on_eof=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --stop-on-stdin-eof) stop_on_eof=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "azurite: unknown argument: $1" >&2; exit 2 ;;
  esac
done

if ! command -v node >/dev/null 2>&1; then
  echo "azurite: Node.js is required to run Azurite; install it, for example: apt-get install nodejs npm" >&2
  exit 3
fi

package="azurite@3.35.0"
cache="${FANLINE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fanline}/azurite-3.35.0"
bin="$cache/node_modules/.bin/azurite-table"

if [ ! -x "$bin" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "azurite: npm is required once, to install $package; install Node.js and npm, for example: apt-get install nodejs npm" >&2
    exit 3
  fi
  mkdir -p "$cache"
  # Two test binaries may start at once: only one installs.
  exec 9>"$cache/.install.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    echo "azurite: installing $package into $cache" >&2
    npm install --prefix "$cache" --no-audit --no-fund --no-save --loglevel=error "$package" >&2
  fi
  flock -u 9
fi

if [ ! -x "$bin" ]; then
  echo "azurite: $package did not install azurite-table under $cache" >&2
  exit 4
fi

# In memory, so it writes no data; it runs in a scratch directory all the same.
workspace="$(mktemp -d)"
cd "$workspace"
args=(--inMemoryPersistence --disableTelemetry --silent --skipApiVersionCheck
      --tableHost 127.0.0.1 --tablePort "$port")

if [ "$stop_on_eof" = 0 ]; then
  trap 'rm -rf "$workspace"' EXIT
  "$bin" "${args[@]}"
  exit $?
fi

"$bin" "${args[@]}" </dev/null >/dev/null &
azurite_pid=$!
trap 'kill "$azurite_pid" 2>/dev/null; wait "$azurite_pid" 2>/dev/null; rm -rf "$workspace"; exit 0' EXIT INT TERM
# Block until whoever started us closes our standard input (or dies).
cat >/dev/null || true
