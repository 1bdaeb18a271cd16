#!/usr/bin/env bash
# Runs promtool with the given arguments, or reports the test skipped (77)
# where Debian's prometheus package is not installed.
if ! command -v promtool >/dev/null 2>&1; then
  echo "skipped: promtool is not installed (Debian package prometheus; make test installs it)"
  exit 77
fi
exec promtool "$@"
