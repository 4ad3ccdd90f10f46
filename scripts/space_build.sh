#!/usr/bin/env bash
# Simulate the Hugging Face Space's build of this repository, offline, as faithfully as this machine allows:
#   1. lay out in DIR what would be pushed to the Space, and its size;
#   2. check the README's front matter (the Space's settings) against requirements.txt and this Python;
#   3. install into DIR/.venv as a Space does, timed (with pip's cache, which a Space's build does not use);
#   4. start the app as a CPU Space does, time its start and one /generate call (scripts/space_check.py).
# Usage: scripts/space_build.sh [--layout-only] DIR   (DIR new or empty; --layout-only: steps 1 and 2)
# SPACE_PYTHON: the Python to build with (default python3). Exits non-zero with a one-line reason.
set -euo pipefail
export LC_NUMERIC=C  # decimal points in the timings

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CHECK=$REPO/scripts/space_check.py
PY=${SPACE_PYTHON:-python3}
BIG=$((10 * 1024 * 1024))  # the Hub refuses larger files in a plain git push: they go through Xet

# What the app reads at run time, and what the README (the Space's page of files) links to: the app reads the
# bundle's weights, config, tokenizer and judge, bench_results.json (the tour and the Trade-off tab), the presets
# and ImageNet class names in assets/models; the README links to docs/, its screenshot and the model's card. The
# Space has no use for tests/, scripts/, .ci/, the dev configs, the card's samples, study figures, CSV and summary.
SHIPPED=(README.md app.py requirements.txt coolsd assets/models docs assets/screenshot.png
         assets/fashion/README.md assets/fashion/config.json 'assets/fashion/*.safetensors'
         assets/fashion/tokenizer.json assets/fashion/bench_results.json
         ':(exclude,glob)**/__pycache__/**' ':(exclude)*.pyc')

say() { echo "space_build: $*"; }
fail() { echo "space_build: FAILED: $*" >&2; exit 1; }
since() { awk -v start="$1" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.1f", now - start }'; }
mib() { awk -v bytes="$1" 'BEGIN { printf "%.1f", bytes / 1048576 }'; }

lay_out() {  # the tracked files only (git ls-files), so that untracked junk never ships
  local dir=$1 path
  if [[ -e $dir && -n $(ls -A "$dir") ]]; then fail "$dir is not empty: give a new or empty folder"; fi
  mkdir -p "$dir"
  while IFS= read -r -d '' path; do
    [[ -f $path ]] || fail "$path is tracked but missing from the work tree"
    cp --parents "$path" "$dir/" || fail "could not copy $path"
  done < <(git -C "$REPO" ls-files -z -- "${SHIPPED[@]}")
}

report_sizes() {
  local dir=$1 size path total=0 count=0
  while IFS=$'\t' read -r size path; do
    total=$((total + size)) count=$((count + 1))
    if ((size > BIG)); then say "over 10 MiB (Xet on a git push; hf upload handles it): $path $(mib "$size") MiB"; fi
  done < <(find "$dir" -type f -printf '%s\t%P\n' | sort -t $'\t' -k2)
  say "upload: $count files, $(mib "$total") MiB"
}

pip_step() {  # pip install "${@:2}" into the Space's venv $VENV, its time added to $STEPS as "$1 N s"
  local started=$EPOCHREALTIME log
  log=$(mktemp)
  if ! "$VENV/bin/pip" install -q "${@:2}" >"$log" 2>&1; then
    tail -n 25 "$log" >&2
    rm -f "$log"
    fail "pip install ${*:2} (its last lines above)"
  fi
  rm -f "$log"
  STEPS+="${STEPS:+, }$1 $(since "$started") s"
}

install() {  # as a Space: requirements.txt, then gradio at sdk_version with the spaces package every Space has
  local dir=$1 sdk=$2 started=$EPOCHREALTIME
  VENV=$dir/.venv STEPS=
  "$PY" -m venv "$VENV" || fail "$PY -m venv $VENV"
  pip_step "pip -U pip" -U pip  # a Space's build starts with an up-to-date pip
  pip_step requirements.txt -r "$dir/requirements.txt"
  pip_step "gradio==$sdk spaces" "gradio[oauth]==$sdk" "uvicorn>=0.14.0" spaces
  say "install: $(since "$started") s ($STEPS)"
  say "installed: $("$VENV/bin/pip" list --format=freeze 2>/dev/null |
                    grep -iE '^(torch|gradio|spaces|transformers|huggingface.hub)==' | tr '\n' ' ')"
  # a Space does not run pip check, but a conflict here is one its build has too
  local conflicts
  if conflicts=$("$VENV/bin/pip" check 2>&1); then say "pip check: no conflicts"
  else say "WARNING pip check: ${conflicts//$'\n'/; }"; fi
}

main() {
  local layout_only=false dir sdk
  if [[ ${1:-} == --layout-only ]]; then layout_only=true; shift; fi
  [[ $# -eq 1 ]] || fail "usage: scripts/space_build.sh [--layout-only] DIR"
  dir=$(realpath -m "$1")
  command -v "$PY" >/dev/null || fail "no $PY (SPACE_PYTHON)"
  cd "$REPO"  # git ls-files and cp --parents take paths from the repository's root

  lay_out "$dir"
  report_sizes "$dir"
  "$PY" "$CHECK" config "$dir" "$("$PY" -c 'import platform; print(platform.python_version())')" || exit 1
  if $layout_only; then say "OK (layout only)"; exit 0; fi

  sdk=$("$PY" "$CHECK" field "$dir" sdk_version) || exit 1
  install "$dir" "$sdk"
  "$dir/.venv/bin/python" "$CHECK" serve "$dir" || exit 1
  say "OK"
}

main "$@"
