"""Where a path stayed at tau ~1 (forwards >= 0.93 x tokens), what its verifier forwards and its host work cost
against plain decoding's on the same prompt: per bench record, verifier seconds per forward over plain's, host ms a
round beyond plain's, and the speed-up; then the medians per method.

    python plain_step_rows.py bf16/results.json
"""
import json
import statistics
import sys

results = json.load(open(sys.argv[1]))
methods, records = results["methods"], results["records"]
rows = {}
for start in range(0, len(records), len(methods)):  # one prompt's records, in the methods' order
    prompt = {r["method"]: r for r in records[start:start + len(methods)]}
    plain = prompt["plain"]
    plain_forward = plain["verifier_seconds"] / plain["forwards"]
    plain_host = (plain["seconds"] - plain["verifier_seconds"]) / plain["forwards"]
    for method, r in prompt.items():
        if method == "plain" or r["forwards"] < 0.93 * r["tokens"]:
            continue
        host = (r["seconds"] - r["verifier_seconds"] - r["drafter_seconds"]) / r["forwards"]
        speedup = (r["tokens"] / r["seconds"]) / (plain["tokens"] / plain["seconds"])
        rows.setdefault(method, []).append((r["verifier_seconds"] / r["forwards"] / plain_forward,
                                            1000 * (host - plain_host), speedup, r["category"]))
for method, found in rows.items():
    print(f"{method}: {len(found)} records; verifier per forward {statistics.median(x[0] for x in found):.3f}x "
          f"plain's, host {statistics.median(x[1] for x in found):+.2f} ms a round, speed-up "
          f"{statistics.median(x[2] for x in found):.3f}x (medians)")
    print("   ", ", ".join(f"{c} {v:.3f}/{h:+.1f}/{s:.2f}x" for v, h, s, c in found))
