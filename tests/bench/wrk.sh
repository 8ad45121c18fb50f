# wrk.sh - runs wrk with post.lua and turns its last line into shell variables (sourced).
#
# bench_wrk URL BODY CONNECTIONS SECONDS: POSTs BODY to URL/v1/attention for SECONDS with
# CONNECTIONS connections (2 wrk threads, or 1 for one connection), and sets WRK_RPS (answered
# requests per second), WRK_MEAN_MS, WRK_P50_MS, WRK_P99_MS, WRK_MAX_MS, WRK_REQUESTS and
# WRK_ERRORS (non-2xx answers plus socket errors; timeouts are 60 s). Returns 1 when wrk failed
# or nothing was answered. With WRK_V2_HLEN set in the environment, BODY is a binary HTTP v2
# request (post.lua).
bench_wrk() {
    local url=$1 body=$2 conns=$3 secs=$4 threads=2 line
    [ "$conns" -lt 2 ] && threads=1
    line=$(WRK_BODY=$body wrk -t "$threads" -c "$conns" -d "${secs}s" --timeout 60s \
        -s tests/bench/post.lua "$url" 2>&1 | grep '^WRK ') || return 1
    eval "$(echo "$line" | sed -E 's/^WRK //; s/([a-z0-9_]+)=/local_\1=/g')"
    WRK_REQUESTS=$local_requests
    WRK_ERRORS=$((local_non2xx + local_connect + local_read + local_write + local_timeout))
    WRK_RPS=$(awk -v n="$local_requests" -v e="$WRK_ERRORS" -v d="$local_duration_us" \
        'BEGIN { printf "%.1f", (n - e) * 1e6 / d }')
    WRK_MEAN_MS=$(awk -v x="$local_mean_us" 'BEGIN { printf "%.3f", x / 1000 }')
    WRK_P50_MS=$(awk -v x="$local_p50_us" 'BEGIN { printf "%.3f", x / 1000 }')
    WRK_P99_MS=$(awk -v x="$local_p99_us" 'BEGIN { printf "%.3f", x / 1000 }')
    WRK_MAX_MS=$(awk -v x="$local_max_us" 'BEGIN { printf "%.3f", x / 1000 }')
    [ "$local_requests" -gt 0 ]
}
