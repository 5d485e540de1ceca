#!/usr/bin/env bash
# Counts the lines of issue 30's comparison service in its two versions,
# docs/comparison/delayq and docs/comparison/river: every Go file, tests
# included (go.mod and go.sum are not Go files), less blank lines and lines that
# are only a comment (// ..., or inside /* ... */). It prints both counts and
# delayq's as a share of River's, and exits 1 unless delayq's version is at
# least 25 % shorter (issue 30's "Done when").
#
#   scripts/comparison-lines.sh        # run by make lint
set -euo pipefail
cd "$(dirname "$0")/../docs/comparison"

# count DIR: the non-blank, non-comment lines of DIR's Go files.
count() {
  find "$1" -name '*.go' -print0 | xargs -0 cat | awk '
    {
      line = $0
      sub(/^[ \t]+/, "", line)
      if (inblock) {
        if (index(line, "*/") == 0) next
        inblock = 0
        line = substr(line, index(line, "*/") + 2)
        sub(/^[ \t]+/, "", line)
      }
      if (line == "" || line ~ /^\/\//) next
      # a line that opens a block comment is code only when code comes first
      if (line ~ /^\/\*/) {
        if (index(line, "*/") == 0) { inblock = 1; next }
        rest = substr(line, index(line, "*/") + 2)
        sub(/^[ \t]+/, "", rest)
        if (rest == "" || rest ~ /^\/\//) next
      }
      n++
    }
    END { print n + 0 }'
}

delayq=$(count delayq)
river=$(count river)
share=$(awk -v d="$delayq" -v r="$river" 'BEGIN { printf "%.1f", 100 * d / r }')
echo "comparison service: delayq $delayq lines, River $river lines; ratio $share % (delayq must be at most 75 %)"
if ((delayq * 4 > river * 3)); then
  echo "delayq's version is not 25 % shorter than River's" >&2
  exit 1
fi
