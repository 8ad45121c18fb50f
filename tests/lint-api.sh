#!/usr/bin/env bash
# Lints api/openapi.yaml with Spectral (installed by `make lint-api` from the
# pinned lock file) and reports it as one test: "1 passed, 0 failed" or
# "0 passed, 1 failed".  With --filter SUBSTR it runs only when "openapi-lint" contains
# SUBSTR, and otherwise prints "0 passed, 0 failed".
cd "$(dirname "$0")/.." || exit 1
if [ "${1:-}" = --filter ] && [ -n "${2:-}" ]; then
    case openapi-lint in
        *"$2"*) ;;
        *) echo "0 passed, 0 failed"; exit 0 ;;
    esac
fi
if make --no-print-directory lint-api; then
    echo "ok   openapi-lint"
    echo "1 passed, 0 failed"
else
    echo "FAIL openapi-lint: spectral found problems in api/openapi.yaml"
    echo "0 passed, 1 failed"
    exit 1
fi
