#!/usr/bin/env bash
# End-to-end test of the policy playground: build web/pkg (unless PLAYGROUND_SKIP_BUILD=1),
# install playwright-core (npm, no browser download), serve playground/web/ on a free loopback
# port and drive it with headless Debian Chromium (/usr/bin/chromium, `apt-get install chromium`).
# Writes playground/screenshot.png when PLAYGROUND_SCREENSHOT=1 (or a path). Exit non-zero on failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
test_dir="$(pwd)"
web="$(cd ../web && pwd)"

if [[ ! -x "${CHROMIUM:-/usr/bin/chromium}" ]]; then
  echo "playground test: ${CHROMIUM:-/usr/bin/chromium} not found (apt-get install -y chromium)" >&2
  exit 1
fi

if [[ "${PLAYGROUND_SKIP_BUILD:-0}" != 1 ]]; then
  ../build.sh >/dev/null
fi
[[ -f "$web/pkg/apf_playground_bg.wasm" ]] || { echo "playground test: $web/pkg missing (run ../build.sh)" >&2; exit 1; }

if [[ ! -d node_modules/playwright-core ]]; then
  npm ci --no-audit --no-fund >&2
fi

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')"
python3 -m http.server --bind 127.0.0.1 --directory "$web" "$port" >"${TMPDIR:-/tmp}/apf-playground-http.$$.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "${TMPDIR:-/tmp}/apf-playground-http.$$.log"' EXIT
for _ in $(seq 1 50); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/index.html', timeout=1)" 2>/dev/null; then break; fi
  sleep 0.1
done

shot="${PLAYGROUND_SCREENSHOT:-}"
if [[ "$shot" == 1 ]]; then shot="$(cd .. && pwd)/screenshot.png"; fi
PLAYGROUND_URL="http://127.0.0.1:$port/index.html" PLAYGROUND_SCREENSHOT="$shot" \
  node --test --test-reporter=spec "$test_dir/playground.test.mjs"
