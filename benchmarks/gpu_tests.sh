#!/bin/bash
# The GPU tests one file at a time, each under its own limit, every file's outcome kept even
# when the device call's own limit cuts the step (a killed `pytest -q` loses its report).
#
#   OUT=DIR bash benchmarks/gpu_tests.sh SECONDS_PER_FILE FILE...      # from the repository root
#
# Per file: DIR/tests/<file>.xml (pytest's JUnit XML: every test's outcome and failure text)
# and DIR/tests/<file>.log (its -v -rfE --tb=short output: each test named as it ends), then
# one line appended to DIR/tests/summary.jsonl: {"file", "exit", "s", "passed", "failed",
# "errors", "skipped", "failures": [{"test", "message"}]}. A file cut by its limit gets
# "exit": 124 and no counts (pytest writes its XML at the end); its log names the tests that
# ended before the cut. Meant as a gpu_call.sh step:
#   'tests:330:bash benchmarks/gpu_tests.sh 75 tests/test_plan_data_gpu.py tests/gpu/test_regen_gpu.py'
set -u
OUT=${OUT:?set OUT to the folder that comes back}
limit=${1:?seconds per file}
shift
mkdir -p "$OUT/tests"
for f in "$@"; do
  name=$(echo "$f" | tr '/' '_')
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" python3 -m pytest -v -rfE --tb=short -p no:cacheprovider -m gpu \
    -o faulthandler_timeout=$((limit - 10)) --junitxml="$OUT/tests/$name.xml" "$f" \
    > "$OUT/tests/$name.log" 2>&1
  rc=$?
  python3 - "$f" "$rc" "$t0" "$OUT/tests/$name.xml" >> "$OUT/tests/summary.jsonl" <<'EOF'
import json, sys, time
import xml.etree.ElementTree as ET
f, rc, t0, xml = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
line = {"file": f, "exit": rc, "s": round(time.time() - t0, 1)}
counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
failures = []
try:
    for case in ET.parse(xml).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed" if bad.tag == "failure" else "errors"] += 1
            failures.append({"test": case.get("name"),
                             "message": (bad.get("message") or "")[:600]})
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    line.update(counts, failures=failures)
except (OSError, ET.ParseError):
    line["xml"] = "none (pytest did not finish writing it)"
print(json.dumps(line))
EOF
  tail -1 "$OUT/tests/summary.jsonl"
done
