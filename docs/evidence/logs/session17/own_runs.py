import glob, json
rows = []
for f in sorted(f for f in glob.glob("benchmarks/results/reproduce_small_*.json") if "own_runs" not in f):
    d = json.load(open(f))
    n = len(d["per_operator"][0]["inside"])
    # Files written before 16a57fc counted every record of the index: the last d["times"]
    # runs are that verify's own.
    before = d.get("earlier_verify_runs", n - d["times"])
    new = [o["inside"][n - d["times"] if "earlier_verify_runs" not in d else 0:] for o in d["per_operator"]]
    ins, cmp_ = sum(sum(x) for x in new), sum(len(x) for x in new)
    rows.append({"file": f.split("/")[-1], "device": d["device"], "date": d["date"], "earlier_runs": before,
                 "counted_then": [d["inside"], d["compared"]], "new_inside": ins, "new_compared": cmp_})
fresh = [r for r in rows if "H200" in r["device"] and "fresh" in r["file"]]
print(json.dumps({"note": "the committed compact release (reproduce_small_h200) re-verified: each "
                  "file's own re-runs. Files written before 16a57fc counted the earlier records "
                  "of the release's index.json as well (counted_then). Computed "
                  "by docs/evidence/logs/session17/own_runs.py.", "rows": rows,
                  "fresh_h200_machines": {"inside": sum(r["new_inside"] for r in fresh),
                                          "compared": sum(r["new_compared"] for r in fresh),
                                          "files": [r["file"] for r in fresh]}}, indent=1))
