#!/usr/bin/env bash
# Builds every Python and JavaScript guest example under plugins/guests into
# OUT_DIR as <lang>-<example>.wasm (py-hello.wasm, js-long.wasm, ...), with
# the exact toolchain versions pinned below.
#
#   plugins/guests/build.sh OUT_DIR [python] [js]
#
# With no language named, both are built. Toolchains (see plugins/guests/docs/):
#   Python:     pip install componentize-py==0.25.1
#   JavaScript: Node.js 20+ with npm; componentize-js 0.23.0 is pinned in
#               plugins/guests/js/package.json + package-lock.json, and this
#               script runs `npm ci` there when node_modules is missing or
#               holds another version.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
COMPONENTIZE_JS_VERSION=0.23.0
WORLD=task-plugin

# The world an example (language, name) builds against: the `long`
# examples keep key-value state in their `mode=nondet`, so they import
# wasi:keyvalue as well; Python's sends HTTP requests through wasi:http
# (JavaScript's fetch() brings its own imports), and JavaScript's reads
# granted directories through wasi:filesystem (Python has open()).
world_of() {
  case "$1-$2" in
    python-long) echo task-plugin-http ;;
    js-long) echo task-plugin-files ;;
    *) echo "$WORLD" ;;
  esac
}
# The host links the outgoing half of wasi:http (fetch() reaches only the
# hosts of --allow-http) but serves no incoming requests: build without the
# fetch event, or the component exports wasi:http's incoming handler.
JS_DISABLE=(fetch-event)

usage() {
  echo "usage: $0 OUT_DIR [python] [js]" >&2
  exit 2
}

die() {
  echo "error: $*" >&2
  exit 1
}

[ $# -ge 1 ] || usage
case "$1" in -h | --help) usage ;; esac

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
wit="$root/wit"
[ -f "$wit/task-plugin.wit" ] || die "cannot find $wit/task-plugin.wit"
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift

langs=("$@")
[ ${#langs[@]} -gt 0 ] || langs=(python js)
for lang in "${langs[@]}"; do
  case "$lang" in python | js) ;; *) die "unknown language '$lang' (use python and/or js)" ;; esac
done

# --- Python ------------------------------------------------------------------

build_python() {
  if ! command -v componentize-py >/dev/null 2>&1; then
    die "componentize-py is not installed; install it with: pip install componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
  local have
  have=$(componentize-py --version 2>/dev/null | awk '{print $2}')
  if [ "$have" != "$COMPONENTIZE_PY_VERSION" ]; then
    die "componentize-py $have is installed but these examples are pinned to $COMPONENTIZE_PY_VERSION; install it with: pip install componentize-py==$COMPONENTIZE_PY_VERSION"
  fi
  local dir name
  for dir in "$here"/python/*/; do
    [ -f "$dir/app.py" ] || continue
    name=$(basename "$dir")
    echo "building py-$name.wasm (componentize-py $COMPONENTIZE_PY_VERSION)" >&2
    # -p: the example's own directory first (its app.py), then the directory
    # holding the shared taskhost.py helper.
    componentize-py -q -d "$wit" -w "$(world_of python "$name")" componentize \
      -p "$dir" -p "$here/python" app -o "$out/py-$name.wasm"
    # The embedded interpreter leaves bytecode next to the sources.
    rm -rf "$dir/__pycache__" "$here/python/__pycache__"
  done
}

# --- JavaScript --------------------------------------------------------------

build_js() {
  command -v node >/dev/null 2>&1 ||
    die "node is not installed; install Node.js 20 or newer with npm (for example: apt-get install nodejs npm)"
  command -v npm >/dev/null 2>&1 ||
    die "npm is not installed; install it with Node.js 20 or newer (for example: apt-get install npm)"
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  [ "$major" -ge 20 ] || die "node $(node --version) is too old; install Node.js 20 or newer"

  local js="$here/js"
  local pkg="$js/node_modules/@bytecodealliance/componentize-js/package.json"
  local have=""
  [ -f "$pkg" ] && have=$(node -p "require('$pkg').version")
  if [ "$have" != "$COMPONENTIZE_JS_VERSION" ]; then
    echo "installing componentize-js $COMPONENTIZE_JS_VERSION: npm ci in $js" >&2
    (cd "$js" && npm ci --no-audit --no-fund) ||
      die "npm ci failed in $js; install the pinned toolchain with: (cd $js && npm ci)"
    have=$(node -p "require('$pkg').version")
    [ "$have" = "$COMPONENTIZE_JS_VERSION" ] ||
      die "npm ci installed componentize-js $have, not $COMPONENTIZE_JS_VERSION; check $js/package-lock.json"
  fi
  local dir name
  for dir in "$js"/*/; do
    [ -f "$dir/index.js" ] || continue
    name=$(basename "$dir")
    [ "$name" = node_modules ] && continue
    echo "building js-$name.wasm (componentize-js $COMPONENTIZE_JS_VERSION)" >&2
    # componentize-js maps its working directory into the build, so run it
    # from plugins/guests/js: the examples import ../taskhost.js.
    (cd "$js" && ./node_modules/.bin/componentize-js "$name/index.js" \
      -w "$wit" -n "$(world_of js "$name")" -d "${JS_DISABLE[@]}" -o "$out/js-$name.wasm")
    [ -s "$out/js-$name.wasm" ] || die "componentize-js wrote no $out/js-$name.wasm"
  done
}

for lang in "${langs[@]}"; do
  "build_$lang"
done
ls -l "$out"/*.wasm >&2
