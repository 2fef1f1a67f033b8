"""tools/check_commits.sh (``make lint``): commit subjects of at most 72 characters, a blank line before a body;
commits older than the rule are left alone. On real git repositories made here."""

from __future__ import annotations

import os
import subprocess

from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "tools" / "check_commits.sh"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})


def commit(repo, message: str, date: str) -> None:
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    done = run(
        *git, "commit", "-q", "--allow-empty", "-m", message, env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    )
    assert done.returncode == 0, done.stderr


def check(repo) -> subprocess.CompletedProcess:
    return run("bash", str(SCRIPT), str(repo), env={"COMMITS_SINCE": "2026-01-01T00:00:00Z"})


def test_long_subjects_and_bodies_without_a_blank_line_fail_after_the_rule_only(tmp_path):
    assert run("git", "init", "-q", str(tmp_path)).returncode == 0
    commit(tmp_path, "x" * 200, "2025-06-01T00:00:00Z")  # before the rule: left alone
    commit(tmp_path, "A short subject\n\nThe body says why.", "2026-02-01T00:00:00Z")
    assert check(tmp_path).returncode == 0
    commit(tmp_path, "y" * 73, "2026-02-02T00:00:00Z")
    commit(tmp_path, "Subject\nbody glued to it", "2026-02-03T00:00:00Z")
    result = check(tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert "subject is 73 characters (at most 72)" in lines[1] and "no blank line" in lines[0], lines
    assert "x" * 10 not in result.stdout
