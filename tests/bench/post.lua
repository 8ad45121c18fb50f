-- post.lua - wrk script: POST the file named by $WRK_BODY to /v1/attention, and at the end print
-- one machine-readable line (bench_http.sh parses it). With $WRK_V2_HLEN set, the body is a
-- binary HTTP v2 request to the model attention instead (its JSON header that many bytes long):
--   WRK requests=N duration_us=N non2xx=N connect=N read=N write=N timeout=N
--       mean_us=X p50_us=N p99_us=N max_us=N
-- Answers other than 2xx are counted by wrk as status errors; the benchmark treats any error
-- as a failed run.
local path = os.getenv("WRK_BODY")
local f = assert(io.open(path, "rb"), "cannot read WRK_BODY " .. tostring(path))
wrk.method = "POST"
local hlen = os.getenv("WRK_V2_HLEN")
if hlen then
    wrk.path = "/v2/models/attention/infer"
    wrk.headers["Content-Type"] = "application/octet-stream"
    wrk.headers["Inference-Header-Content-Length"] = hlen
else
    wrk.path = "/v1/attention"
    wrk.headers["Content-Type"] = "application/json"
end
wrk.body = f:read("*a")
f:close()

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "WRK requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d " ..
        "mean_us=%.1f p50_us=%d p99_us=%d max_us=%d\n",
        summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
        latency.mean, latency:percentile(50), latency:percentile(99), latency.max))
end
