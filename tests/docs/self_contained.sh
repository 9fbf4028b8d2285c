#!/usr/bin/env bash
# The repository explains itself: no tracked file cites a document kept outside the checkout, a
# path above it, or an issue number, and every repository path a file names (docs/x.md,
# strategies/y.cpp, ...) exists. Names of other projects' files (cited sources) and examples of
# a user's own files are listed in `allowed` below.
#   tests/docs/self_contained.sh REPO_ROOT
set -euo pipefail
root=${1:?usage: self_contained.sh REPO_ROOT}
cd "$root"
self=tests/docs/self_contained.sh

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files)
else
  mapfile -t files < <(find . -type f -not -path './build*' -not -path './.git/*' | sed 's|^\./||')
fi
checked=()
for f in "${files[@]}"; do
  [ "$f" = "$self" ] && continue
  [ -f "$f" ] && checked+=("$f")
done

status=0
outside='(DESIGN|STRATEGIES|VALIDATION)\.md|SIMGRID-NOTES|\.\./shared/|/work/|\b[Ii]ssues? #?[0-9]+\b|\bissue-[0-9]+\b|\(#[0-9]+\)'
if hits=$(grep -I -n -E "$outside" "${checked[@]}"); then
  echo "self_contained: cites something outside the repository (a founding document, a path" \
    "above the checkout, an issue number):"
  echo "$hits"
  status=1
fi

# Repository paths named in text must exist. Allowed: other projects' files cited as sources
# ("docs/legacy.md of deepseek-ai/DeepEP"), the tutorial's user file, the fuzz targets' input names.
allowed=' docs/legacy.md docs/performance-summary.md scenarios/my-h100.yaml scenarios/fuzz.yaml
 scenarios/sweeps/fuzz.yaml scenarios/models/hf/fuzz.json '
dirs='scenarios|docs|bench|tests|scripts|core|sim|strategies|exec|kernels|topology|apps|cmake'
exts='md|hpp|cpp|yaml|sh|csv|cu|cuh|txt|json|py'
missing=0
while IFS= read -r p; do
  case "$allowed" in *" $p "* | *" $p"$'\n'*) continue ;; esac
  if [ ! -e "$p" ]; then
    echo "self_contained: '$p' is named but not in the repository:"
    grep -I -n -m 1 -F "$p" "${checked[@]}" || true
    missing=1
  fi
done < <(grep -I -o -h -E "\\b($dirs)/[A-Za-z0-9_./+-]*[A-Za-z0-9_]\\.($exts)\\b" "${checked[@]}" |
  sort -u)
[ $missing -eq 0 ] || status=1
[ $status -eq 0 ] && echo "self_contained: ${#checked[@]} files, nothing cited outside the repository"
exit $status
