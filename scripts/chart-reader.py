#!/usr/bin/env python3
"""Reads one series' day at a 1-hour step over one keep-alive connection, as a dashboard does,
for SECONDS, PAUSE seconds between reads (0: again at once). Prints the reads, p50 and p99.

usage: chart-reader.py PORT TOKEN SECONDS PAUSE [SERIES]"""
import http.client, sys, time, urllib.parse

port, token, seconds, pause = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
series = sys.argv[5] if len(sys.argv) > 5 else "sensor.value,device=d0"
path = (f"/v1/series/{urllib.parse.quote(series, safe='')}/points"
        "?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&step=1h&agg=avg")
connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
headers = {"authorization": f"Bearer {token}"}
took, end = [], time.monotonic() + seconds
while time.monotonic() < end:
    began = time.perf_counter()
    connection.request("GET", path, headers=headers)
    response = connection.getresponse()
    body = response.read()
    took.append((time.perf_counter() - began) * 1000)
    if response.status != 200 or b'"items":[]' in body:
        sys.exit(f"a chart read answered {response.status}, with no hour: {body[:200]!r}")
    if pause:
        time.sleep(pause)
took.sort()
print(f"{len(took)} reads, p50 {took[len(took) // 2]:.2f} ms, p99 {took[int(len(took) * 0.99)]:.2f} ms")
