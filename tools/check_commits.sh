#!/usr/bin/env bash
# `make lint`'s check of commit messages: every commit made since the rule began (SINCE, the
# committer's date) has a subject of at most 72 characters and, when it has a body, a blank line
# between them, so `git log --oneline` can be scanned. Older history is left as it was.
#   bash tools/check_commits.sh [<git dir or work tree>]
set -uo pipefail
repo="${1:-$(dirname "$0")/..}"
since="${COMMITS_SINCE:-2026-11-27T02:30:00Z}"
limit=72
if ! git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  echo "check_commits: $repo is not a git checkout; nothing to check"
  exit 0
fi
status=0
while IFS= read -r -d '' record; do
  hash=${record%%$'\n'*}
  message=${record#*$'\n'}
  subject=${message%%$'\n'*}
  if [ "${#subject}" -gt "$limit" ]; then
    echo "check_commits: ${hash:0:7}'s subject is ${#subject} characters (at most $limit): $subject"
    status=1
  fi
  rest=${message#"$subject"}
  if [ -n "${rest//$'\n'/}" ] && [ "${rest:0:2}" != $'\n\n' ]; then
    echo "check_commits: ${hash:0:7} has no blank line between its subject and its body"
    status=1
  fi
done < <(git -C "$repo" log --since="$since" --format='%H%n%B%x00' | sed -z 's/^\n//')
[ "$status" = 0 ] || echo "check_commits: reword them (git commit --amend, or git rebase -i for older ones) before pushing"
exit "$status"
